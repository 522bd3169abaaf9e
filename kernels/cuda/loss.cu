// Fused softmax cross-entropy, one block per row: a block max, a block exp-sum, then the
// gradient written once, in place if dlogits aliases logits (every read of the row happens
// before the first write). The shard variants split it at its reductions as on the CPU.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {
namespace {

void check_targets(const char* op, const int32_t* targets, int64_t N, int64_t V) {
  const int64_t bad = first_bad_index(N, [=] __device__(int64_t n) { return targets[n] >= V; });
  LLMT_CHECK(bad < 0, op, ": target ", bad < 0 ? 0 : read_back(targets + bad), " at row ", bad,
             " is outside the vocabulary [0, ", V, ")");
}

__device__ float row_max(const float* x, int64_t V) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i]);
  return block_max(m);
}

__device__ float row_exp_sum(const float* x, int64_t V, float m) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += expf(x[i] - m);
  return block_sum(s);
}

// d (V) = exp(x - lse) * dloss, minus dloss at t (t outside [0, V): none); d may alias x.
__device__ void write_grad(float* d, const float* x, int64_t V, float lse, int64_t t, float dloss) {
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    d[i] = expf(x[i] - lse) * dloss - (i == t ? dloss : 0.0f);
}

__device__ void zero_row(float* d, int64_t V) {
  if (d)
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) d[i] = 0.0f;
}

__global__ void softmax_ce_kernel(float* losses, float* dlogits, const float* logits,
                                  const int32_t* targets, int64_t V, float dloss) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * V;
  float* d = dlogits ? dlogits + n * V : nullptr;
  const int32_t t = targets[n];
  if (t < 0) {
    if (threadIdx.x == 0) losses[n] = 0.0f;
    zero_row(d, V);
    return;
  }
  const float xt = x[t];
  const float m = row_max(x, V);
  const float lse = m + logf(row_exp_sum(x, V, m));  // block_sum syncs: every read is done
  if (threadIdx.x == 0) losses[n] = lse - xt;
  if (d) write_grad(d, x, V, lse, t, dloss);
}

__global__ void shard_max_kernel(float* max, const float* logits, int64_t Vl) {
  const float m = row_max(logits + blockIdx.x * Vl, Vl);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

__global__ void shard_sums_kernel(float* sums, const float* logits, const float* max,
                                  const int32_t* targets, int64_t N, int64_t Vl,
                                  int64_t vocab_start) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * Vl;
  const float s = row_exp_sum(x, Vl, max[n]);
  if (threadIdx.x == 0) {
    sums[n] = s;
    const int64_t t = static_cast<int64_t>(targets[n]) - vocab_start;
    sums[N + n] = targets[n] >= 0 && t >= 0 && t < Vl ? x[t] : 0.0f;
  }
}

__global__ void shard_finish_kernel(float* losses, float* dlogits, const float* logits,
                                    const float* max, const float* sums, const int32_t* targets,
                                    int64_t N, int64_t Vl, int64_t vocab_start, float dloss) {
  const int64_t n = blockIdx.x;
  float* d = dlogits ? dlogits + n * Vl : nullptr;
  if (targets[n] < 0) {
    if (threadIdx.x == 0) losses[n] = 0.0f;
    zero_row(d, Vl);
    return;
  }
  const float lse = max[n] + logf(sums[n]);
  if (threadIdx.x == 0) losses[n] = lse - sums[N + n];
  if (d)
    write_grad(d, logits + n * Vl, Vl, lse, static_cast<int64_t>(targets[n]) - vocab_start, dloss);
}

}  // namespace

void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t N, int64_t V, float dloss) {
  check_targets("softmax_cross_entropy", targets, N, V);
  if (N == 0) return;
  softmax_ce_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(losses, dlogits, logits,
                                                                         targets, V, dloss);
  LLMT_CUDA_LAUNCHED();
}

void cross_entropy_shard_max(float* max, const float* logits, const int32_t* targets, int64_t N,
                             int64_t Vl, int64_t V) {
  check_targets("cross_entropy", targets, N, V);
  if (N == 0) return;
  shard_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(max, logits, Vl);
  LLMT_CUDA_LAUNCHED();
}

void cross_entropy_shard_sums(float* sums, const float* logits, const float* max,
                              const int32_t* targets, int64_t N, int64_t Vl, int64_t vocab_start) {
  if (N == 0) return;
  shard_sums_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(sums, logits, max, targets,
                                                                         N, Vl, vocab_start);
  LLMT_CUDA_LAUNCHED();
}

void cross_entropy_shard_finish(float* losses, float* dlogits, const float* logits,
                                const float* max, const float* sums, const int32_t* targets,
                                int64_t N, int64_t Vl, int64_t vocab_start, float dloss) {
  if (N == 0) return;
  shard_finish_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
      losses, dlogits, logits, max, sums, targets, N, Vl, vocab_start, dloss);
  LLMT_CUDA_LAUNCHED();
}

}  // namespace llmt::cuda
