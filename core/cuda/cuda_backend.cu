// CUDA device memory, pinned host staging memory, copies and streams. Copies are issued on the
// backend's compute stream and waited for, so callers see synchronous semantics; kernels
// (kernels/cuda) use the same stream.
#include <cublas_api.h>
#include <cuda_runtime.h>
#if __has_include(<nccl.h>)
#include <nccl.h>
#endif
#ifdef LLMTRAIN_HAVE_CUDNN
#include <cudnn_version.h>
#endif

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"

namespace llmt {

namespace {

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {
    LLMT_CUDA_CHECK(cudaSetDevice(index));
    compute_ = static_cast<cudaStream_t>(cuda_compute_stream());
    // Freed memory stays in the device's pool for the next allocation instead of going back to
    // the driver at every synchronization.
    cudaMemPool_t pool = nullptr;
    LLMT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
    uint64_t keep = UINT64_MAX;
    LLMT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  Device device() const override { return {DeviceKind::cuda, index_}; }
  // Stream-ordered (cudaMallocAsync/cudaFreeAsync on the compute stream): unlike cudaFree, a free
  // never synchronizes the device, so it cannot wait for an NCCL stream blocked on a peer. The
  // pipeline executor frees activations in every backward; with device-synchronizing frees,
  // interleaved schedules deadlock under NCCL (P2pMatchingLimits in test_p2p_matching). Memory
  // is reused in compute-stream order; other streams that read a buffer (NCCL) wait for the
  // compute stream before their call, and the caller waits for them before freeing it.
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, compute_);
    if (err != cudaSuccess)
      throw Error(detail::concat("cudaMallocAsync of ", bytes, " bytes on GPU ", index_,
                                 " failed: ", cudaGetErrorString(err)));
    return p;
  }
  void deallocate(void* p) override { cudaFreeAsync(p, compute_); }
  void memset_zero(void* p, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, compute_));
  }
  void synchronize() override { LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_)); }
  // Page-locked, so that cudaMemcpyAsync to and from it is a direct DMA at full PCIe speed.
  void* allocate_host(size_t bytes) override {
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
    if (err != cudaSuccess)
      throw Error(detail::concat("cudaHostAlloc of ", bytes,
                                 " bytes of pinned host memory for GPU ", index_,
                                 " failed: ", cudaGetErrorString(err)));
    return p;
  }
  void deallocate_host(void* p) override { cudaFreeHost(p); }

 private:
  int index_;
  cudaStream_t compute_;  // the process's compute stream (never destroyed)
};

}  // namespace

void* cuda_compute_stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    LLMT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

std::string cuda_version_info() {
  // Versions of the headers this build was compiled against (the kernels link cuBLASLt and, for
  // fused attention, cuDNN when cmake/cudnn.cmake found it; NCCL is engine/comm's), then the
  // driver found at run time.
  std::string s =
      detail::concat("CUDA ", CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10, ", cuBLASLt ",
                     CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, ".", CUBLAS_VER_PATCH);
#if __has_include(<nccl.h>)
  s += detail::concat(", NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH);
#endif
#ifdef LLMTRAIN_HAVE_CUDNN
  s += detail::concat(", cuDNN ", CUDNN_MAJOR, ".", CUDNN_MINOR, ".", CUDNN_PATCHLEVEL,
                      " (fused attention)");
#else
  s += ", cuDNN not used (not found at build time; attention uses the flash kernel)";
#endif
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0)
    s += detail::concat(", driver ", driver / 1000, ".", driver % 1000 / 10);
  else
    s += ", no driver found";
  return s;
}

GpuInfo cuda_gpu_info(int device_index) {
  cudaDeviceProp prop{};
  LLMT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  int clock_khz = 0;
  LLMT_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_index));
  return {prop.name, prop.major, prop.minor, prop.multiProcessorCount, clock_khz * 1e3};
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::pair<double, double> cuda_memory_info(int device_index) {
  int current = 0;
  if (device_index < 0 || device_index >= cuda_device_count() ||
      cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device_index) != cudaSuccess)
    return {-1, -1};
  size_t free = 0, total = 0;
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  cudaSetDevice(current);
  if (!ok) return {-1, -1};
  return {static_cast<double>(free), static_cast<double>(total)};
}

std::unique_ptr<DeviceBackend> make_cuda_backend(int device_index) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || (err == cudaSuccess && n == 0))
    throw Error(
        "device = \"cuda\" requested, but no CUDA GPU is visible (the driver is loaded; check "
        "CUDA_VISIBLE_DEVICES); set device = \"cpu\" or \"auto\"");
  if (err != cudaSuccess)
    throw Error(detail::concat(
        "device = \"cuda\" requested, but this CUDA build cannot start CUDA: ",
        cudaGetErrorString(err), " (no NVIDIA driver on this machine, or one older than the CUDA ",
        CUDART_VERSION / 1000, " runtime needs); set device = \"cpu\" or \"auto\""));
  if (device_index >= n)
    throw Error(detail::concat("GPU ", device_index,
                               " requested (the rank's local index) but only ", n,
                               " visible: one rank per GPU"));
  return std::make_unique<CudaBackend>(device_index);
}

}  // namespace llmt
