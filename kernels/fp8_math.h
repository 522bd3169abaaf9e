// FP8 quantisation (train.fp8, docs/model.md), written once for the CPU kernels
// (kernels/cpu/precision.cpp) and the CUDA ones (kernels/cuda/precision.cu), so the two give the
// same bits. Plain C++ that nvcc also compiles as __host__ __device__; included only by kernel
// sources.
//
// A tile of values with absolute maximum amax gets the scale s = amax / fmt_max (fp32 division)
// and each value v of it becomes s * fp8(v / s) (fp32 division and product; fp8() rounds to the
// nearest value of the format, ties to even, saturating at +-fmt_max): the value an FP8 GEMM with
// fp32 accumulation multiplies. A tile whose amax is 0 stays 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace llmt::kernel_math {

// The OCP FP8 formats: E4M3 (finite-only "fn": largest 448, smallest normal 2^-6, subnormals in
// steps of 2^-9) and E5M2 (largest 57344, smallest normal 2^-14, subnormals in steps of 2^-16).
// `fmt`: 0 = E4M3, 1 = E5M2 (ops::Fp8Format).
struct Fp8Spec {
  int mantissa_bits;
  int min_exponent;  // of the smallest normal
  float max;
};

LLMT_HOST_DEVICE inline Fp8Spec fp8_spec(int fmt) {
  return fmt == 0 ? Fp8Spec{3, -6, 448.0f} : Fp8Spec{2, -14, 57344.0f};
}

LLMT_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
LLMT_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// v rounded to the nearest value of the format, ties to even, saturating at +-max; +-0, inf and
// NaN unchanged. Branch-free, so that the CPU loops over it vectorise.
LLMT_HOST_DEVICE inline float fp8_round(float v, int fmt) {
  const Fp8Spec f = fp8_spec(fmt);
  const uint32_t bits = float_bits(v), mag = bits & 0x7fffffffu;
  // The exponent of |v|'s leading bit, or the format's smallest normal one (its subnormals share
  // that spacing), at most 127 (inf and NaN, replaced below); the format's values around |v| are
  // 2^(lead - mantissa_bits) apart. Scaling by powers of two is exact (|v| / spacing <
  // 2^(mantissa_bits + 1)), rintf rounds to nearest even.
  int lead = static_cast<int>(mag >> 23) - 127;
  lead = lead < f.min_exponent ? f.min_exponent : lead;
  lead = lead > 127 ? 127 : lead;
  const int shift = lead - f.mantissa_bits;
  float r = rintf(bits_float(mag) * bits_float(static_cast<uint32_t>(127 - shift) << 23)) *
            bits_float(static_cast<uint32_t>(127 + shift) << 23);
  r = r > f.max ? f.max : r;
  r = bits_float(float_bits(r) | (bits & 0x80000000u));  // v's sign
  return mag >= 0x7f800000u ? v : r;
}

// The bits of |v| as an unsigned integer (ordered as |v| is), NaN as 0: the tiles' maxima are
// taken on these, so that a NaN never becomes a scale (it propagates through the quantised
// value instead).
LLMT_HOST_DEVICE inline uint32_t abs_bits(float v) {
  const uint32_t mag = float_bits(v) & 0x7fffffffu;
  return mag > 0x7f800000u ? 0u : mag;
}

// One value of a tile with absolute maximum amax, quantised and dequantised.
LLMT_HOST_DEVICE inline float fp8_quantize_value(float v, float amax, int fmt) {
  if (!(amax > 0.0f)) return 0.0f;
  const float s = amax / fp8_spec(fmt).max;
  return s * fp8_round(v / s, fmt);
}

}  // namespace llmt::kernel_math
