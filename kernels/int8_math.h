// Block-wise int8 quantisation (ZeRO++'s quantised weight all-gather, parallel.
// zero_quantized_weights; docs/parallelism.md), written once for the CPU kernels
// (kernels/cpu/precision.cpp) and the CUDA ones (kernels/cuda/precision.cu), so the two give the
// same bits. Plain C++ that nvcc also compiles as __host__ __device__; included only by kernel
// sources.
//
// A run of L values is cut into blocks of B (the last one partial). A block with absolute maximum
// amax gets the scale s = amax / 127 (fp32 division) and each value v of it the code
// q = clamp(rne(v / s), -127, 127) (fp32 division, rounded to nearest, ties to even); it reads
// back as s * q (fp32 product). A block whose amax is 0 gets s = 0 and reads back 0; a block
// holding an inf or a NaN keeps s = amax (inf or NaN) with codes 0, so it reads back NaN, never
// as plausible weights.
//
// Packed layout, in 32-bit words: per block, word 0 is s (its float bits), then ceil(B/4) words of
// codes, code j in byte j % 4 (bits 8 (j % 4) .. 8 (j % 4) + 7, two's complement) of word j / 4;
// a partial block's unused codes are 0. So W(L) = ceil(L/B) (1 + ceil(B/4)) words per run.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/fp8_math.h"  // float_bits, bits_float
#include "kernels/host_device.h"

namespace llmt::kernel_math {

LLMT_HOST_DEVICE inline int64_t int8_block_words(int64_t block) {
  return 1 + (block + 3) / 4;
}
LLMT_HOST_DEVICE inline int64_t int8_packed_words(int64_t n, int64_t block) {
  return (n + block - 1) / block * int8_block_words(block);
}

// The scale of a block whose largest |v| is amax.
LLMT_HOST_DEVICE inline float int8_scale(float amax) {
  return amax > 0.0f && amax <= 3.4028235e38f ? amax / 127.0f : amax;
}

// The code of v under scale s (0 where s is 0 or not finite).
LLMT_HOST_DEVICE inline int32_t int8_code(float v, float s) {
  if (!(s > 0.0f && s <= 3.4028235e38f)) return 0;
  const float q = rintf(v / s);  // current rounding mode: to nearest, ties to even
  return static_cast<int32_t>(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
}

// The value of code number j (0-based, in the block) of a block's code words.
LLMT_HOST_DEVICE inline float int8_value(const int32_t* codes, int64_t j, float s) {
  const uint32_t w = static_cast<uint32_t>(codes[j / 4]);
  const int32_t q = static_cast<int8_t>((w >> (8 * (j % 4))) & 0xffu);
  return s * static_cast<float>(q);
}

LLMT_HOST_DEVICE inline uint32_t int8_byte(int32_t q, int64_t j) {
  return (static_cast<uint32_t>(q) & 0xffu) << (8 * (j % 4));
}

LLMT_HOST_DEVICE inline float int8_bits_float(int32_t w) {
  return bits_float(static_cast<uint32_t>(w));
}

// Quantises one block's `len` values x into its bw words w (the scale, then the codes).
LLMT_HOST_DEVICE inline void int8_quantize_block(int32_t* w, const float* x, int64_t len,
                                                 int64_t bw) {
  float amax = 0.0f;
  for (int64_t j = 0; j < len; ++j) {  // NaN propagates (fmax would drop it)
    const float a = fabsf(x[j]);
    amax = a > amax || a != a ? a : amax;
  }
  const float s = int8_scale(amax);
  w[0] = static_cast<int32_t>(float_bits(s));
  for (int64_t j = 1; j < bw; ++j) w[j] = 0;
  for (int64_t j = 0; j < len; ++j)
    w[1 + j / 4] = static_cast<int32_t>(static_cast<uint32_t>(w[1 + j / 4]) |
                                        int8_byte(int8_code(x[j], s), j));
}

}  // namespace llmt::kernel_math
