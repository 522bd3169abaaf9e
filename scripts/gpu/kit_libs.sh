# shellcheck shell=bash
# The shared libraries of the GPU kit (scripts/gpu/kit.sh), by soname, in three lists that
# together must cover every library `ldd` reports for llmtrain and the GPU test programs
# (kit_uncovered checks it; tests/CMakeLists.txt runs that check on the CPU binary in CI).
# Sourced, not run.

# The C library and its parts: every Linux machine has them, and the kit must use the GPU
# machine's own (a newer glibc runs programs linked against an older one).
KIT_BASE_LIBS=(
  linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2
  librt.so.1 libresolv.so.2
)

# NVIDIA's libraries: too large to carry (cuBLASLt alone is ~500 MB), and present on a GPU
# machine as PyTorch's pip packages (site-packages/nvidia/*/lib) or the CUDA toolkit. run.sh
# finds them there. libcuda.so.1 is the driver's and never in the kit.
KIT_NVIDIA_LIBS=(
  libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13
)

# Everything else: the Debian packages' libraries, copied into the kit's lib/ (HDF5 brings
# curl and its TLS and Kerberos stack; OpenBLAS brings gfortran; oneDNN, the CPU's bf16 GEMMs,
# brings the OpenCL loader of its GPU runtime).
KIT_LIBS=(
  libstdc++.so.6 libgcc_s.so.1 libgomp.so.1
  libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libhwloc.so.15 libevent_core-2.1.so.7
  libevent_pthreads-2.1.so.7 libudev.so.1
  libhdf5_serial.so.103 libsz.so.2 libaec.so.0 libz.so.1 libzstd.so.1
  libcurl.so.4 libnghttp2.so.14 libidn2.so.0 libunistring.so.2 librtmp.so.1 libssh2.so.1
  libpsl.so.5 libssl.so.3 libcrypto.so.3 libgssapi_krb5.so.2 libkrb5.so.3 libk5crypto.so.3
  libkrb5support.so.0 libcom_err.so.2 libkeyutils.so.1 libldap-2.5.so.0 liblber-2.5.so.0
  libsasl2.so.2 libbrotlidec.so.1 libbrotlicommon.so.1 libgnutls.so.30 libhogweed.so.6
  libnettle.so.8 libgmp.so.10 libp11-kit.so.0 libtasn1.so.6 libffi.so.8
  libsentencepiece.so.0 libsentencepiece_train.so.0 libtomlplusplus.so.3 libxxhash.so.0
  libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libdnnl.so.2 libOpenCL.so.1
)

# kit_uncovered BINARY...: prints each soname `ldd` reports for the binaries that no list above
# names (nothing when the kit covers them all); fails if ldd fails.
kit_uncovered() {
  local known=" ${KIT_BASE_LIBS[*]} ${KIT_NVIDIA_LIBS[*]} ${KIT_LIBS[*]} " b lib
  for b in "$@"; do
    ldd "$b" >/dev/null || return 1
    for lib in $(ldd "$b" | awk '{print $1}'); do
      case "$lib" in /*) lib="$(basename "$lib")" ;; esac
      [[ "$known" == *" $lib "* ]] || echo "$lib"
    done
  done | sort -u
}
