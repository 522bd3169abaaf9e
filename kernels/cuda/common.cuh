// Building blocks shared by the CUDA kernels (the counterpart of kernels/cpu/kernel_util.h):
// error checks, the compute stream, grid-stride maps, warp and block reductions, column sums for
// parameter gradients, the counter-based RNG on the device, grow-on-demand scratch memory, and
// the read-back of a kernel's
// "first bad index" for argument errors only the data can reveal (token ids, targets).
// Included only by kernels/cuda/*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/rng.h"

// After a launch: reports a bad configuration at once (execution errors surface at the next
// synchronising call).
#define LLMT_CUDA_LAUNCHED() LLMT_CUDA_CHECK(cudaGetLastError())

namespace llmt::cuda {

inline cudaStream_t stream() {
  return static_cast<cudaStream_t>(cuda_compute_stream());
}

inline constexpr int kThreads = 256;  // threads per block of the elementwise and row kernels

// Blocks of kThreads covering n elements, capped (grid-stride loops do the rest).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

template <typename F>
__global__ void for_each_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    f(i);
}

// f(i) for i in [0, n) on the compute stream; f is a __device__ lambda.
template <typename F>
void for_each(int64_t n, F f) {
  if (n <= 0) return;
  for_each_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(n, f);
  LLMT_CUDA_LAUNCHED();
}

// ---- reductions -------------------------------------------------------------------------------

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// The reduction of v over the block (every thread gets it). Needs blockDim.x a multiple of 32
// and every thread of the block to call it; reusable back to back.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : identity;
  return warp_reduce(v, op);
}

template <typename T>
__device__ T block_sum(T v) {
  return block_reduce(v, SumOp{}, T{0});
}
__device__ inline float block_max(float v) {
  return block_reduce(v, MaxOp{}, -INFINITY);
}

// ---- random numbers (core/rng.h on the device) ------------------------------------------
// rng::key is constexpr, so device code calls it directly (--expt-relaxed-constexpr); uniform and
// normal are restated here with the same arithmetic.

__device__ inline float rng_uniform(uint64_t k) {
  return static_cast<float>(k >> 40) * (1.0f / 16777216.0f);
}

__device__ inline float rng_normal(uint64_t k) {
  const double u1 = (static_cast<double>(k >> 32) + 1.0) * (1.0 / 4294967297.0);
  const double u2 = static_cast<double>(k & 0xffffffffULL) * (1.0 / 4294967296.0);
  return static_cast<float>(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// ---- scratch memory ---------------------------------------------------------------------------

// Device memory a kernel file keeps for itself (16-bit operand copies, partial sums), grown on
// demand and kept, so that after the first steps no call allocates. Used in compute-stream order:
// a call's kernels have read it before the next call's overwrite it. Growing is stream-ordered
// too (cudaFreeAsync / cudaMallocAsync): queued kernels keep the old memory, and nothing
// synchronizes the device, as a cudaFree would (waiting for NCCL streams that may be blocked on a
// peer; cuda_backend.cu allocates the same way). Outside the Allocator's accounting.
class Scratch {
 public:
  void* reserve(size_t bytes) {
    if (bytes <= bytes_) return data_;
    if (data_) LLMT_CUDA_CHECK(cudaFreeAsync(data_, stream()));
    data_ = nullptr;
    bytes_ = 0;
    LLMT_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream()));
    bytes_ = bytes;
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// dst (C) += sum over rows n of f(n, c), deterministic: no atomics, and an order of additions
// that depends on N and C only. The rows are cut into R chunks of at least 256 rows (R <= 64);
// a block of 32 columns x 8 row groups sums one chunk, its groups' partial sums added in shared
// memory in a fixed order, and with R > 1 writes the chunk's sums to scratch (R, C), which a
// second kernel adds column by column in chunk order. One chunk per column block left a
// (8192, 768) LayerNorm gradient 24 blocks for 132 SMs (12% of a bf16 GPT-2 step, docs/gpu.md).
template <typename F>
__global__ void column_partials_kernel(float* out, int64_t N, int64_t C, int64_t rows, F f) {
  __shared__ float part[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t n0 = blockIdx.y * rows, n1 = n0 + rows < N ? n0 + rows : N;
  float s = 0.0f;
  if (c < C)
    for (int64_t n = n0 + threadIdx.y; n < n1; n += 8) s += f(n, c);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int g = 1; g < 8; ++g) s += part[g][threadIdx.x];
    if (gridDim.y == 1)
      out[c] += s;
    else
      out[blockIdx.y * C + c] = s;
  }
}

template <typename T>  // a template only to be defined in a header: T = float
__global__ void add_column_partials_kernel(T* dst, const T* partials, int64_t R, int64_t C) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < C;
       c += int64_t{gridDim.x} * blockDim.x) {
    T s = 0;
    for (int64_t r = 0; r < R; ++r) s += partials[r * C + c];
    dst[c] += s;
  }
}

template <typename F>
void add_column_sums(float* dst, int64_t N, int64_t C, F f) {
  if (C <= 0) return;
  constexpr int64_t kMinRows = 256, kMaxChunks = 64;
  const int64_t R = N <= kMinRows ? 1 : std::min(kMaxChunks, (N + kMinRows - 1) / kMinRows);
  const int64_t rows = R == 1 ? N : (N + R - 1) / R;
  static Scratch scratch;  // per call site (F): the (R, C) partial sums
  float* out = R == 1 ? dst : static_cast<float*>(scratch.reserve(sizeof(float) * R * C));
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(R));
  column_partials_kernel<<<grid, dim3(32, 8), 0, stream()>>>(out, N, C, rows, f);
  LLMT_CUDA_LAUNCHED();
  if (R > 1) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((C + 255) / 256, 1024));
    add_column_partials_kernel<<<blocks, 256, 0, stream()>>>(dst, out, R, C);
    LLMT_CUDA_LAUNCHED();
  }
}


// ---- data-dependent argument checks -----------------------------------------------------------

// The smallest i in [0, n) with bad(i), or -1: one kernel, then a blocking read-back (the only
// way to turn a bad token id on the device into the CPU kernels' exception).
template <typename Bad>
int64_t first_bad_index(int64_t n, Bad bad) {
  static unsigned long long* slot = [] {
    unsigned long long* p = nullptr;
    LLMT_CUDA_CHECK(cudaMalloc(&p, sizeof *p));
    return p;
  }();
  if (n <= 0) return -1;
  LLMT_CUDA_CHECK(cudaMemsetAsync(slot, 0xff, sizeof *slot, stream()));
  unsigned long long* s = slot;
  for_each(n, [=] __device__(int64_t i) {
    if (bad(i)) atomicMin(s, static_cast<unsigned long long>(i));
  });
  unsigned long long host = 0;
  LLMT_CUDA_CHECK(cudaMemcpyAsync(&host, slot, sizeof host, cudaMemcpyDeviceToHost, stream()));
  LLMT_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return host == ~0ULL ? -1 : static_cast<int64_t>(host);
}

// One element of device memory, read back (blocking): for error messages.
template <typename T>
T read_back(const T* p) {
  T v{};
  LLMT_CUDA_CHECK(cudaMemcpyAsync(&v, p, sizeof v, cudaMemcpyDeviceToHost, stream()));
  LLMT_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return v;
}

}  // namespace llmt::cuda
