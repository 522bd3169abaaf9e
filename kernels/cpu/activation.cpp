// GELU (tanh approximation) and SwiGLU. Pure elementwise maps, so they split into contiguous
// chunks over threads; tanh and sigmoid go through exp_approx so the inner loops vectorise
// (libm's tanhf/expf would keep them scalar).
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluK = 0.044715f;

// tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|) <= 1: no overflow for any u.
inline float tanh_approx(float u) {
  const float e = exp_approx(-2.0f * std::fabs(u));
  return std::copysign((1.0f - e) / (1.0f + e), u);
}

inline float sigmoid(float x) {
  return 1.0f / (1.0f + exp_approx(-x));
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  parallel_for(n, kGrainElems, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + tanh_approx(kGeluS * (x + kGeluK * x * x * x)));
    }
  });
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  parallel_for(n, kGrainElems, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float x = inp[i];
      const float t = tanh_approx(kGeluS * (x + kGeluK * x * x * x));
      const float du = kGeluS * (1.0f + 3.0f * kGeluK * x * x);
      dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    }
  });
}

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
  parallel_for(N, grain_rows(F), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* gate = inp + n * 2 * F;
      const float* up = gate + F;
      float* o = out + n * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) o[f] = gate[f] * sigmoid(gate[f]) * up[f];
    }
  });
}

// d gate = dout * up * s (1 + g (1 - s)), d up = dout * g * s, with s = sigmoid(g).
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F) {
  parallel_for(N, grain_rows(F), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* gate = inp + n * 2 * F;
      const float* up = gate + F;
      const float* d = dout + n * F;
      float* dgate = dinp + n * 2 * F;
      float* dup = dgate + F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) {
        const float g = gate[f], s = sigmoid(g);
        dgate[f] = d[f] * up[f] * s * (1.0f + g * (1.0f - s));
        dup[f] = d[f] * g * s;
      }
    }
  });
}

}  // namespace llmt::cpu
