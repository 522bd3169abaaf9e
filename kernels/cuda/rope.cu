// Rotary position embedding, "rotate half" pairing (i, i + R/2) over the R rotated dims [r0,
// r0 + R) of each head: one thread per pair, the angle computed in double as on the CPU (pos * 1
// rad loses digits in float), the frequency scaled as kernels/rope_math.h says. Backward negates
// it.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {
namespace {

void rope_rotate(float* x, int64_t B, int64_t T, int64_t HT, int64_t D, int64_t n_rot, int64_t r0,
                 int64_t R, int64_t pos_offset, const int32_t* pos, float theta,
                 RopeScaling scaling, float sign) {
  const int64_t half = R / 2;
  const double log_theta = log(static_cast<double>(theta));
  const double mag = kernel_math::rope_cos_sin_factor(scaling);
  for_each(B * T * n_rot * half, [=] __device__(int64_t j) {
    const int64_t i = j % half, h = j / half % n_rot, bt = j / (half * n_rot);
    const double freq = kernel_math::rope_scaled_freq(
        exp(log_theta * (-2.0 * i / static_cast<double>(R))), i, R, theta, scaling);
    const int64_t t = bt % T;
    const double angle = static_cast<double>(pos ? pos[t] : pos_offset + t) * freq;
    const float c = static_cast<float>(mag * cos(angle)),
                s = sign * static_cast<float>(mag * sin(angle));
    float* lo = x + (bt * HT + h) * D + r0;
    const float a = lo[i], b = lo[i + half];
    lo[i] = a * c - b * s;
    lo[i + half] = b * c + a * s;
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

}  // namespace llmt::cuda
