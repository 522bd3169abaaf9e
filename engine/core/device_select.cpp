// Picks the DeviceBackend for a Device. The CUDA backend is compiled in only with LLMTRAIN_CUDA;
// without it, asking for a GPU fails with a message that says so.
#include "engine/core/allocator.h"

#ifdef LLMTRAIN_HAVE_CUDA
#include "engine/core/cuda/cuda_backend.h"
#endif

namespace llmt {

bool cuda_built_in() {
#ifdef LLMTRAIN_HAVE_CUDA
  return true;
#else
  return false;
#endif
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
