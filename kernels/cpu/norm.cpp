// LayerNorm and RMSNorm as one row kernel with a `kCenter` switch (RMSNorm = LayerNorm without
// the mean). Rows run in parallel; the weight/bias gradients are per-thread column sums added
// together at the end (parallel_rows_sum), so backward never races on dweight.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

// out (N,C) = (x - mean) * rstd * weight + bias; mean (N) (kCenter only), rstd (N).
template <bool kCenter>
void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                  const float* bias, int64_t N, int64_t C, float eps) {
  parallel_for(N, grain_rows(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* x = inp + n * C;
      float mu = 0.0f;
      if constexpr (kCenter) {
#pragma omp simd reduction(+ : mu)
        for (int64_t c = 0; c < C; ++c) mu += x[c];
        mu /= static_cast<float>(C);
        mean[n] = mu;
      }
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += (x[c] - mu) * (x[c] - mu);
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
      rstd[n] = r;
      float* o = out + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - mu) * r * weight[c] + (bias ? bias[c] : 0.0f);
    }
  });
}

// With norm = (x - mean) * rstd and g = dout * weight:
//   dinp = (g - mean(g) - norm * mean(g * norm)) * rstd   (no mean(g) term without centering)
//   dweight += dout * norm, dbias += dout.
template <bool kCenter>
void norm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, const float* mean, const float* rstd, int64_t N,
                   int64_t C) {
  const int64_t width = dbias ? 2 * C : C;  // accumulators: [dweight | dbias]
  auto acc = parallel_rows_sum(N, grain_rows(C), width, [&](int64_t begin, int64_t end, float* a) {
    for (int64_t n = begin; n < end; ++n) {
      const float* x = inp + n * C;
      const float* d = dout + n * C;
      const float mu = kCenter ? mean[n] : 0.0f, r = rstd[n];
      float g_mean = 0.0f, gn_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gn_mean)
      for (int64_t c = 0; c < C; ++c) {
        const float g = d[c] * weight[c];
        g_mean += g;
        gn_mean += g * (x[c] - mu) * r;
      }
      g_mean = kCenter ? g_mean / static_cast<float>(C) : 0.0f;
      gn_mean /= static_cast<float>(C);
      float* dx = dinp + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (x[c] - mu) * r;
        a[c] += d[c] * norm;
        if (dbias) a[C + c] += d[c];
        dx[c] = (d[c] * weight[c] - g_mean - norm * gn_mean) * r;
      }
    }
  });
  accumulate(dweight, acc.data(), C);
  if (dbias) accumulate(dbias, acc.data() + C, C);
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

}  // namespace llmt::cpu
