// GELU (tanh approximation) and SwiGLU as grid-stride maps; the formulas are the CPU kernels'.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {
namespace {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluK = 0.044715f;

__device__ inline float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  for_each(n, [=] __device__(int64_t i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluS * (x + kGeluK * x * x * x)));
  });
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  for_each(n, [=] __device__(int64_t i) {
    const float x = inp[i];
    const float t = tanhf(kGeluS * (x + kGeluK * x * x * x));
    const float du = kGeluS * (1.0f + 3.0f * kGeluK * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  });
}

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
  for_each(N * F, [=] __device__(int64_t i) {
    const int64_t n = i / F, f = i % F;
    const float g = inp[n * 2 * F + f], up = inp[n * 2 * F + F + f];
    out[i] = g * sigmoid(g) * up;
  });
}

// d gate = dout * up * s (1 + g (1 - s)), d up = dout * g * s, with s = sigmoid(g).
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F) {
  for_each(N * F, [=] __device__(int64_t i) {
    const int64_t n = i / F, f = i % F;
    const float g = inp[n * 2 * F + f], up = inp[n * 2 * F + F + f], s = sigmoid(g);
    dinp[n * 2 * F + f] = dout[i] * up * s * (1.0f + g * (1.0f - s));
    dinp[n * 2 * F + F + f] = dout[i] * g * s;
  });
}

}  // namespace llmt::cuda
