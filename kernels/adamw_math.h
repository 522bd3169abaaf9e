// The AdamW element update, written once for every path that applies it: the CPU kernels
// (per tensor and over a tensor list, kernels/cpu/optim.cpp) and the CUDA kernels
// (kernels/cuda/optim.cu), so the paths cannot drift apart. Plain C++ that nvcc also compiles as
// __host__ __device__; included only by kernel sources.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace llmt::kernel_math {

// The step's scalars, computed once on the host: the bias corrections folded into a step size
// and a factor on sqrt(v).
struct AdamWCoeffs {
  float beta1, beta2, eps;
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  float grad_scale;    // g = grad * grad_scale
};

inline AdamWCoeffs adamw_coeffs(float lr, float beta1, float beta2, float eps, int64_t step,
                                float grad_scale) {
  const auto t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  return {
      beta1,     beta2, eps, static_cast<float>(lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
      grad_scale};
}

// The factor on p of decoupled weight decay.
inline float adamw_decay(float lr, float weight_decay) {
  return 1.0f - lr * weight_decay;
}

// One element: p -= lr * (wd * p + (m / bc1) / (sqrt(v / bc2) + eps)), rearranged so it has one
// sqrt and one division: p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps).
LLMT_HOST_DEVICE inline void adamw_element(float& p, float& m, float& v, float grad, float decay,
                                           const AdamWCoeffs& c) {
  const float g = grad * c.grad_scale;
  const float mi = c.beta1 * m + (1.0f - c.beta1) * g;
  const float vi = c.beta2 * v + (1.0f - c.beta2) * g * g;
  m = mi;
  v = vi;
#ifdef __CUDA_ARCH__
  const float root = sqrtf(vi);
#else
  const float root = std::sqrt(vi);
#endif
  p = p * decay - c.step_size * mi / (root * c.inv_sqrt_bc2 + c.eps);
}

}  // namespace llmt::kernel_math
