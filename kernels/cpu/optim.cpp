// AdamW and the reductions the optimizer needs (grad norms, overflow checks). One pass over
// memory each; reductions keep one partial per thread chunk and add them in chunk order, so a
// rerun with the same thread count gives the same bits (OpenMP's reduction clause would not).
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

// Sum of f(i) over [0, n) in double, deterministic for a given thread count. Sixteen
// independent lane accumulators break the add dependency chain (one accumulator made this
// latency-bound at a third of memory bandwidth).
template <typename F>
double parallel_sum(int64_t n, F&& f) {
  constexpr int kLanes = 16;
  const int nt = threads_for(n, kGrainElems);
  std::vector<double> partial(nt, 0.0);
  run_chunks(n, nt, [&](int64_t t, int64_t begin, int64_t end) {
    double acc[kLanes] = {};
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) acc[l] += f(i + l);
    }
    for (; i < end; ++i) acc[0] += f(i);
    double s = 0.0;
    for (double a : acc) s += a;
    partial[t] = s;
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale) {
  // p -= lr * (wd * p + (m / bc1) / (sqrt(v / bc2) + eps)), rearranged so the loop has one sqrt
  // and one division: p * (1 - lr * wd) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
  const auto t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  const auto step_size = static_cast<float>(lr / bc1);
  const auto inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - lr * weight_decay;
  parallel_for(n, kGrainElems, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float g = grad[i] * grad_scale;
      const float mi = beta1 * m[i] + (1.0f - beta1) * g;
      const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
      m[i] = mi;
      v[i] = vi;
      param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
  });
}

double sum_squares(const float* x, int64_t n) {
  return parallel_sum(n, [=](int64_t i) {
    const double d = x[i];
    return d * d;
  });
}

bool has_nonfinite(const float* x, int64_t n) {
  constexpr uint32_t kExp = 0x7f800000u;  // all exponent bits set: inf or nan
  return parallel_sum(n, [=](int64_t i) {
           return (std::bit_cast<uint32_t>(x[i]) & kExp) == kExp ? 1.0 : 0.0;
         }) > 0.0;
}

}  // namespace llmt::cpu
