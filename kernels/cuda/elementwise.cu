// Elementwise maps, fills, copies and dropout: grid-stride maps (common.cuh) on the compute
// stream. Dropout's mask is the CPU kernel's pure function of (seed, stream, global index).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {

void add(float* out, const float* a, const float* b, int64_t n) {
  for_each(n, [=] __device__(int64_t i) { out[i] = a[i] + b[i]; });
}

void add_inplace(float* dst, const float* src, int64_t n) {
  for_each(n, [=] __device__(int64_t i) { dst[i] += src[i]; });
}

void scale_inplace(float* x, float s, int64_t n) {
  for_each(n, [=] __device__(int64_t i) { x[i] *= s; });
}

void add_bias(float* x, const float* bias, int64_t N, int64_t C) {
  for_each(N * C, [=] __device__(int64_t i) { x[i] += bias[i % C]; });
}

void fill(float* x, float value, int64_t n) {
  for_each(n, [=] __device__(int64_t i) { x[i] = value; });
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;  // an empty tensor may have no memory at all
  cudaPointerAttributes a{}, b{};
  LLMT_CUDA_CHECK(cudaPointerGetAttributes(&a, dst));
  LLMT_CUDA_CHECK(cudaPointerGetAttributes(&b, src));
  LLMT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
  // Pageable host memory may be reused as soon as we return: wait when either side is host.
  const bool host = a.type != cudaMemoryTypeDevice || b.type != cudaMemoryTypeDevice;
  if (host) LLMT_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void fill_zero(void* x, size_t bytes) {
  if (bytes == 0) return;
  LLMT_CUDA_CHECK(cudaMemsetAsync(x, 0, bytes, stream()));
}

void dropout(float* out, const float* inp, int64_t n, float p, uint64_t seed, uint64_t stream_id,
             int64_t global_offset) {
  const float scale = 1.0f / (1.0f - p);
  for_each(n, [=] __device__(int64_t i) {
    const bool keep = rng_uniform(rng::key(seed, stream_id, global_offset + i)) >= p;
    out[i] = keep ? inp[i] * scale : 0.0f;
  });
}

}  // namespace llmt::cuda
