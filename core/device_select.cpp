// Picks the DeviceBackend for a Device and the Device for a `train.device` setting. The CUDA
// backend is compiled in only with LLMTRAIN_CUDA; without it, asking for a GPU fails with a
// message that says so.
#include <cstdlib>

#include "core/allocator.h"

#ifdef LLMTRAIN_HAVE_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace llmt {

bool cuda_built_in() {
#ifdef LLMTRAIN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Device select_device(std::string_view setting, int local_rank) {
  if (setting == "cpu") return {DeviceKind::cpu, 0};
  if (setting == "cuda") return {DeviceKind::cuda, local_rank};
  LLMT_CHECK(setting == "auto", "train.device = \"", setting, "\": expected auto, cpu or cuda");
#ifdef LLMTRAIN_HAVE_CUDA
  if (cuda_device_count() > 0) return {DeviceKind::cuda, local_rank};
#endif
  return {DeviceKind::cpu, 0};
}

void request_eager_module_loading() {
#ifdef LLMTRAIN_HAVE_CUDA
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
#endif
}

double gpu_free_bytes(Device d) {
  if (d.kind != DeviceKind::cuda) return -1;
#ifdef LLMTRAIN_HAVE_CUDA
  return cuda_memory_info(d.index).first;
#else
  return -1;
#endif
}

std::string built_in_backends() {
  std::string s = "cpu (OpenMP + BLAS)";
#ifdef LLMTRAIN_HAVE_CUDA
  s += ", cuda (" + cuda_version_info() + ")";
#endif
  return s;
}

std::unique_ptr<DeviceBackend> make_device_backend(Device d) {
  if (d.kind == DeviceKind::cpu) return make_cpu_backend();
#ifdef LLMTRAIN_HAVE_CUDA
  return make_cuda_backend(d.index);
#else
  throw Error(
      "device = \"cuda\" requested, but this llmtrain was built without CUDA (LLMTRAIN_CUDA=OFF); "
      "rebuild with the CUDA toolkit, or set device = \"cpu\"");
#endif
}

}  // namespace llmt
