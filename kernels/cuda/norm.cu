// LayerNorm and RMSNorm as one row kernel with a kCenter switch (RMSNorm = LayerNorm without the
// mean), one block per row with block reductions. The weight/bias gradients are column sums over
// the rows (add_column_sums: deterministic, no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {
namespace {

template <bool kCenter>
__global__ void norm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, int64_t C, float eps) {
  const int64_t n = blockIdx.x;
  const float* x = inp + n * C;
  float mu = 0.0f;
  if constexpr (kCenter) {
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
    mu = block_sum(s) / static_cast<float>(C);
  }
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += (x[c] - mu) * (x[c] - mu);
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) {
    if constexpr (kCenter) mean[n] = mu;
    rstd[n] = r;
  }
  float* o = out + n * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    o[c] = (x[c] - mu) * r * weight[c] + (bias ? bias[c] : 0.0f);
}

// dinp = (g - mean(g) - norm * mean(g * norm)) * rstd, g = dout * weight (no mean(g) without
// centering).
template <bool kCenter>
__global__ void norm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd,
                                     int64_t C) {
  const int64_t n = blockIdx.x;
  const float* x = inp + n * C;
  const float* d = dout + n * C;
  const float mu = kCenter ? mean[n] : 0.0f, r = rstd[n];
  float g_sum = 0.0f, gn_sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = d[c] * weight[c];
    g_sum += g;
    gn_sum += g * (x[c] - mu) * r;
  }
  const float g_mean = kCenter ? block_sum(g_sum) / static_cast<float>(C) : 0.0f;
  const float gn_mean = block_sum(gn_sum) / static_cast<float>(C);
  float* dx = dinp + n * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dx[c] = (d[c] * weight[c] - g_mean - (x[c] - mu) * r * gn_mean) * r;
}

template <bool kCenter>
void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                  const float* bias, int64_t N, int64_t C, float eps) {
  if (N == 0) return;
  norm_forward_kernel<kCenter><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
      out, mean, rstd, inp, weight, bias, C, eps);
  LLMT_CUDA_LAUNCHED();
}

template <bool kCenter>
void norm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, const float* mean, const float* rstd, int64_t N,
                   int64_t C) {
  if (N == 0) return;
  norm_backward_kernel<kCenter>
      <<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(dinp, dout, inp, weight, mean, rstd, C);
  LLMT_CUDA_LAUNCHED();
  add_column_sums(dweight, N, C, [=] __device__(int64_t n, int64_t c) {
    const float mu = kCenter ? mean[n] : 0.0f;
    return dout[n * C + c] * (inp[n * C + c] - mu) * rstd[n];
  });
  if (dbias)
    add_column_sums(dbias, N, C, [=] __device__(int64_t n, int64_t c) { return dout[n * C + c]; });
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
  norm_forward<true>(out, mean, rstd, inp, weight, bias, N, C, eps);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
  norm_backward<true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int64_t C, float eps) {
  norm_forward<false>(out, nullptr, rstd, inp, weight, nullptr, N, C, eps);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C) {
  norm_backward<false>(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C);
}

}  // namespace llmt::cuda
