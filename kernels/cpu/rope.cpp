// Rotary position embedding, "rotate half" pairing (i, i + R/2) over the R rotated dims [r0,
// r0 + R) of each head (all D, or multi-head latent attention's rope part). The (T, R/2) cos/sin
// table is computed once per call in double (angles reach pos * 1 rad, where float loses digits),
// the frequencies scaled as kernels/rope_math.h says, then rows (b,t) rotate in parallel.
// Backward is the same rotation with the angle negated.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

// x (B,T,HT,D): dims [r0, r0 + R) of heads [0, n_rot) at position(pos, pos_offset, t) rotated by
// sign * pos * f_i, f_i = theta^(-2i/R) under `scaling`, cos and sin times its attention factor.
void rope_rotate(float* x, int64_t B, int64_t T, int64_t HT, int64_t D, int64_t n_rot, int64_t r0,
                 int64_t R, int64_t pos_offset, const int32_t* pos, float theta,
                 const RopeScaling& scaling, float sign) {
  const int64_t half = R / 2;
  std::vector<double> freq(half);
  for (int64_t i = 0; i < half; ++i)
    freq[i] = kernel_math::rope_scaled_freq(
        std::pow(static_cast<double>(theta), -2.0 * i / static_cast<double>(R)), i, R, theta,
        scaling);
  const double mag = kernel_math::rope_cos_sin_factor(scaling);
  std::vector<float> cos_t(T * half), sin_t(T * half);  // (T, D/2)
  constexpr int64_t kTrigCost = 32;  // a double sin + cos costs about this many element updates
  parallel_for(T, grain_rows(half * kTrigCost), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(position(pos, pos_offset, t)) * freq[i];
        cos_t[t * half + i] = static_cast<float>(mag * std::cos(angle));
        sin_t[t * half + i] = sign * static_cast<float>(mag * std::sin(angle));
      }
  });
  parallel_for(B * T, grain_rows(n_rot * R), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* c = cos_t.data() + (n % T) * half;
      const float* s = sin_t.data() + (n % T) * half;
      for (int64_t h = 0; h < n_rot; ++h) {
        float* lo = x + (n * HT + h) * D + r0;
        float* hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = lo[i], b = hi[i];
          lo[i] = a * c[i] - b * s[i];
          hi[i] = b * c[i] + a * s[i];
        }
      }
    }
  });
}

}  // namespace

void rope_forward(float* x, int64_t B, int64_t T, int64_t HT, int64_t D, int64_t n_rot, int64_t r0,
                  int64_t R, int64_t pos_offset, const int32_t* pos, float theta,
                  RopeScaling scaling) {
  rope_rotate(x, B, T, HT, D, n_rot, r0, R, pos_offset, pos, theta, scaling, 1.0f);
}

void rope_backward(float* dx, int64_t B, int64_t T, int64_t HT, int64_t D, int64_t n_rot,
                   int64_t r0, int64_t R, int64_t pos_offset, const int32_t* pos, float theta,
                   RopeScaling scaling) {
  rope_rotate(dx, B, T, HT, D, n_rot, r0, R, pos_offset, pos, theta, scaling, -1.0f);
}

}  // namespace llmt::cpu
