# cuDNN for the fused attention path (kernels/cuda/attention_cudnn.cpp), CUDA builds only.
# Needs the cuDNN 9 library and headers (found next to the CUDA toolkit or on the default paths)
# and the header-only cuDNN frontend, which this file fetches at configure time: a pinned release
# (the PyPI wheel of nvidia-cudnn-frontend, a zip whose include/ holds the headers; GitHub's
# release tarballs are not always reachable from CI) checked against its SHA-256. When any piece
# is missing, the build goes on without the cuDNN path (attention uses the flash kernel), says so
# here and in `llmtrain --version`.
#
# Sets LLMT_CUDNN_FOUND, LLMT_CUDNN_VERSION (e.g. 9.19.0), LLMT_CUDNN_FRONTEND_VERSION and, when
# found, the INTERFACE target llmt_cudnn (frontend include dir + libcudnn).
option(LLMTRAIN_CUDNN "Use cuDNN's fused attention in the CUDA build (fetches the cuDNN frontend)"
       ON)

set(LLMT_CUDNN_FOUND OFF)
set(LLMT_CUDNN_FRONTEND_VERSION 1.32.0)
set(_fe_wheel nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl)
set(_fe_url "https://files.pythonhosted.org/packages/11/02/660e2dd9f9d9f940e1641443771730612c3aadaafbc5ef7a93cc313d519d/${_fe_wheel}")
set(_fe_sha256 c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0)
set(_fe_dir ${CMAKE_BINARY_DIR}/_deps/cudnn_frontend-${LLMT_CUDNN_FRONTEND_VERSION})

function(_llmt_cudnn_skip)  # the arguments, concatenated, say why
  string(CONCAT why ${ARGV})
  message(WARNING "cuDNN fused attention disabled: ${why}. Attention on CUDA uses the flash "
                  "kernel (docs/gpu.md).")
endfunction()

if(NOT LLMTRAIN_CUDNN)
  message(STATUS "cuDNN: off (LLMTRAIN_CUDNN=OFF)")
  return()
endif()

find_path(LLMT_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(LLMT_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
if(NOT LLMT_CUDNN_INCLUDE_DIR OR NOT LLMT_CUDNN_LIBRARY)
  _llmt_cudnn_skip("cuDNN 9 (cudnn_graph.h, libcudnn) not found")
  return()
endif()
# The frontend's headers define an (experimental, sm100) engine that calls NVRTC.
if(NOT TARGET CUDA::nvrtc)
  _llmt_cudnn_skip("the CUDA toolkit's NVRTC library, which the cuDNN frontend links, not found")
  return()
endif()
file(STRINGS ${LLMT_CUDNN_INCLUDE_DIR}/cudnn_version.h _v REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*CUDNN_MINOR ([0-9]+).*CUDNN_PATCHLEVEL ([0-9]+).*"
                     "\\1.\\2.\\3" LLMT_CUDNN_VERSION "${_v}")
if(LLMT_CUDNN_VERSION VERSION_LESS 9.0)
  _llmt_cudnn_skip("cuDNN ${LLMT_CUDNN_VERSION} is older than 9")
  return()
endif()

# The frontend: reuse an extracted copy, else download (or reuse a wheel placed at _fe_archive)
# and check its hash before extracting.
set(_fe_archive ${CMAKE_BINARY_DIR}/_deps/${_fe_wheel})
if(NOT EXISTS ${_fe_dir}/include/cudnn_frontend.h)
  if(NOT EXISTS ${_fe_archive})
    message(STATUS "cuDNN frontend ${LLMT_CUDNN_FRONTEND_VERSION}: downloading ${_fe_url}")
    file(DOWNLOAD ${_fe_url} ${_fe_archive}.part STATUS _st TIMEOUT 300)
    list(GET _st 0 _code)
    if(NOT _code EQUAL 0)
      file(REMOVE ${_fe_archive}.part)
      list(GET _st 1 _msg)
      _llmt_cudnn_skip("cannot download the cuDNN frontend (${_msg}). To build offline, put "
                       "${_fe_wheel} at ${_fe_archive}")
      return()
    endif()
    file(RENAME ${_fe_archive}.part ${_fe_archive})
  endif()
  file(SHA256 ${_fe_archive} _sha)
  if(NOT _sha STREQUAL _fe_sha256)
    file(REMOVE ${_fe_archive})
    _llmt_cudnn_skip("${_fe_wheel} has SHA-256 ${_sha}, expected ${_fe_sha256}")
    return()
  endif()
  file(ARCHIVE_EXTRACT INPUT ${_fe_archive} DESTINATION ${_fe_dir} PATTERNS "include/*")
  if(NOT EXISTS ${_fe_dir}/include/cudnn_frontend.h)
    _llmt_cudnn_skip("${_fe_wheel} holds no include/cudnn_frontend.h")
    return()
  endif()
endif()

add_library(llmt_cudnn INTERFACE)
target_include_directories(llmt_cudnn SYSTEM INTERFACE ${_fe_dir}/include ${LLMT_CUDNN_INCLUDE_DIR})
target_link_libraries(llmt_cudnn INTERFACE ${LLMT_CUDNN_LIBRARY} CUDA::nvrtc CUDA::cudart)
set(LLMT_CUDNN_FOUND ON)
message(STATUS "cuDNN ${LLMT_CUDNN_VERSION} (${LLMT_CUDNN_LIBRARY}), frontend "
               "${LLMT_CUDNN_FRONTEND_VERSION} (${_fe_dir}): fused attention on")
