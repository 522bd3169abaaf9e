// CUDA device memory, copies and streams. Copies are issued on the backend's compute stream and
// waited for, so callers see synchronous semantics; kernels (kernels/cuda) use the same stream.
#include <cuda_runtime.h>

#include <cstdio>

#include "engine/core/cuda/cuda_backend.h"

#define LLMT_CUDA_CHECK(call)                                                                \
  do {                                                                                       \
    cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess)                                                                 \
      throw ::llmt::Error(::llmt::detail::concat(__FILE__, ":", __LINE__, ": ", #call, ": ", \
                                                 cudaGetErrorString(err_)));                 \
  } while (0)

namespace llmt {

namespace {

struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {
    LLMT_CUDA_CHECK(cudaSetDevice(index));
    cudaStream_t s = nullptr;
    LLMT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    compute_.reset(s);
  }
  Device device() const override { return {DeviceKind::cuda, index_}; }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess)
      throw Error(detail::concat("cudaMalloc of ", bytes, " bytes on GPU ", index_,
                                 " failed: ", cudaGetErrorString(err)));
    return p;
  }
  void deallocate(void* p) override { cudaFree(p); }
  void memset_zero(void* p, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_.get()));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_.get()));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_.get()));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    LLMT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, compute_.get()));
  }
  void synchronize() override { LLMT_CUDA_CHECK(cudaStreamSynchronize(compute_.get())); }

 private:
  int index_;
  StreamPtr compute_;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::unique_ptr<DeviceBackend> make_cuda_backend(int device_index) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    throw Error(detail::concat(
        "device = \"cuda\" requested, but CUDA cannot start: ", cudaGetErrorString(err),
        " (no NVIDIA driver or GPU on this machine?); set device = \"cpu\""));
  if (device_index >= n)
    throw Error(detail::concat("GPU ", device_index, " requested but only ", n, " visible"));
  return std::make_unique<CudaBackend>(device_index);
}

}  // namespace llmt
