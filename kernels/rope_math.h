// RoPE's frequency scaling for contexts beyond the pre-training one, written once for the CPU and
// CUDA rope kernels (kernels/cpu/rope.cpp, kernels/cuda/rope.cu) and for the model, which takes
// the softmax scale from it. Fields named as Hugging Face's `rope_scaling` names them
// ([model.rope_scaling], docs/model.md "RoPE scaling"). Plain C++ that nvcc also compiles as
// __host__ __device__.
//
// Each rotated pair i of R rotated dims turns at f_i = theta^(-2i/R) radians per position; the
// scalings change f_i (positions stay integers):
//   linear  f_i / factor (position interpolation, Chen et al. 2023).
//   llama3  Llama 3.1's: with wavelength w_i = 2 pi / f_i and the original context L,
//           w_i < L / high_freq_factor keeps f_i, w_i > L / low_freq_factor takes f_i / factor,
//           between them (1 - s) f_i / factor + s f_i with s = (L / w_i - low) / (high - low).
//   yarn    YaRN (Peng et al. 2023, "NTK-by-parts"): the dims that turn fewer than beta_slow
//           times over L take f_i / factor, those that turn more than beta_fast times keep f_i,
//           with a linear ramp over the dims between: d(b) = R ln(L / (2 pi b)) / (2 ln theta),
//           lo = max(floor(d(beta_fast)), 0), hi = min(ceil(d(beta_slow)), R - 1) (hi += 0.001
//           when equal), ramp_i = clamp((i - lo) / (hi - lo), 0, 1), f_i' = f_i / factor ramp_i
//           + f_i (1 - ramp_i); cos and sin are multiplied by the attention factor, and with
//           mscale_all_dim (DeepSeek-V2/V3) the softmax scale by m(factor, mscale_all_dim)^2,
//           m(s, k) = 0.1 k ln s + 1 (1 for s <= 1).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace llmt {

enum class RopeType : uint8_t { none, linear, llama3, yarn };

struct RopeScaling {
  RopeType rope_type = RopeType::none;
  float factor = 1.0f;
  int64_t original_max_position_embeddings = 0;           // L (llama3, yarn)
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;  // llama3
  float beta_fast = 32.0f, beta_slow = 1.0f;              // yarn
  float mscale = 1.0f, mscale_all_dim = 0.0f;             // yarn (DeepSeek's)
  float attention_factor = 0.0f;                          // yarn: 0 = derived from the above
  bool operator==(const RopeScaling&) const = default;
};

namespace kernel_math {

constexpr double kTwoPi = 6.283185307179586476925286766559;

// YaRN's m(s, k).
LLMT_HOST_DEVICE inline double yarn_mscale(double scale, double k) {
  return scale <= 1.0 ? 1.0 : 0.1 * k * log(scale) + 1.0;
}

// Pair i's frequency f (the unscaled theta^(-2i/R), computed by the kernel) under `s`.
LLMT_HOST_DEVICE inline double rope_scaled_freq(double f, int64_t i, int64_t R, double theta,
                                                const RopeScaling& s) {
  const double factor = s.factor;
  const double L = static_cast<double>(s.original_max_position_embeddings);
  switch (s.rope_type) {
    case RopeType::none:
      return f;
    case RopeType::linear:
      return f / factor;
    case RopeType::llama3: {
      const double w = kTwoPi / f;
      const double lo_w = L / s.low_freq_factor, hi_w = L / s.high_freq_factor;
      if (w < hi_w) return f;
      if (w > lo_w) return f / factor;
      const double smooth = (L / w - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      return (1.0 - smooth) * f / factor + smooth * f;
    }
    case RopeType::yarn: {
      const auto dim_of = [&](double turns) {
        return static_cast<double>(R) * log(L / (turns * kTwoPi)) / (2.0 * log(theta));
      };
      const double lo = fmax(floor(dim_of(s.beta_fast)), 0.0);
      double hi = fmin(ceil(dim_of(s.beta_slow)), static_cast<double>(R - 1));
      if (hi == lo) hi += 0.001;
      const double ramp = fmin(fmax((static_cast<double>(i) - lo) / (hi - lo), 0.0), 1.0);
      return f / factor * ramp + f * (1.0 - ramp);
    }
  }
  return f;
}

// What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
LLMT_HOST_DEVICE inline double rope_cos_sin_factor(const RopeScaling& s) {
  if (s.rope_type != RopeType::yarn) return 1.0;
  if (s.attention_factor > 0.0f) return s.attention_factor;
  if (s.mscale != 0.0f && s.mscale_all_dim != 0.0f)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

// What the attention's softmax scale 1/sqrt(D) is multiplied by: m(factor, mscale_all_dim)^2
// under YaRN with mscale_all_dim (DeepSeek-V2/V3), else 1.
LLMT_HOST_DEVICE inline double rope_softmax_factor(const RopeScaling& s) {
  if (s.rope_type != RopeType::yarn || s.mscale_all_dim == 0.0f) return 1.0;
  const double m = yarn_mscale(s.factor, s.mscale_all_dim);
  return m * m;
}

}  // namespace kernel_math
}  // namespace llmt
