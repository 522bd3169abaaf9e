// Block-wise integer quantisation in 8 or 4 bits (ZeRO++'s quantised weight all-gather, qwZ, in
// int8 and its quantised gradient reduce-scatter, qgZ, in int4: parallel.zero_quantized_weights
// and zero_quantized_gradients; docs/parallelism.md), written once for the CPU kernels
// (kernels/cpu/precision.cpp) and the CUDA ones (kernels/cuda/precision.cu), so the two give the
// same bits. Plain C++ that nvcc also compiles as __host__ __device__; included only by kernel
// sources.
//
// Codes of b bits (8 or 4) hold integers in [-Q, Q], Q = 2^(b-1) - 1 (127 or 7). A run of L
// values is cut into blocks of B (the last one partial). A block with absolute maximum amax gets
// the scale s = amax / Q (fp32 division) and each value v of it the code
// q = clamp(rne(v / s), -Q, Q) (fp32 division, rounded to nearest, ties to even); it reads back as
// s * q (fp32 product). A block whose amax is 0 gets s = 0 and reads back 0; a block holding an
// inf or a NaN keeps s = amax (inf or NaN) with codes 0, so it reads back NaN, never as plausible
// values.
//
// Packed layout, in 32-bit words: per block, word 0 is s (its float bits), then ceil(B / (32/b))
// words of codes, 32/b to a word: code j in bits b (j % (32/b)) .. b (j % (32/b)) + b - 1 (two's
// complement) of word j / (32/b); a partial block's unused codes are 0. So
// W(L) = ceil(L/B) (1 + ceil(B b / 32)) words per run.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/fp8_math.h"  // float_bits, bits_float
#include "kernels/host_device.h"

namespace llmt::kernel_math {

LLMT_HOST_DEVICE inline int64_t int_codes_per_word(int bits) {
  return 32 / bits;
}
LLMT_HOST_DEVICE inline int64_t int_block_words(int64_t block, int bits) {
  return 1 + (block + int_codes_per_word(bits) - 1) / int_codes_per_word(bits);
}
LLMT_HOST_DEVICE inline int64_t int_packed_words(int64_t n, int64_t block, int bits) {
  return (n + block - 1) / block * int_block_words(block, bits);
}
LLMT_HOST_DEVICE inline float int_max_code(int bits) {
  return static_cast<float>((1 << (bits - 1)) - 1);
}

// The scale of a block whose largest |v| is amax.
LLMT_HOST_DEVICE inline float int_scale(float amax, int bits) {
  return amax > 0.0f && amax <= 3.4028235e38f ? amax / int_max_code(bits) : amax;
}

// The code of v under scale s (0 where s is 0 or not finite).
LLMT_HOST_DEVICE inline int32_t int_code(float v, float s, int bits) {
  if (!(s > 0.0f && s <= 3.4028235e38f)) return 0;
  const float q = rintf(v / s);  // current rounding mode: to nearest, ties to even
  const float Q = int_max_code(bits);
  return static_cast<int32_t>(q > Q ? Q : q < -Q ? -Q : q);
}

// Code j's bits within its word.
LLMT_HOST_DEVICE inline int int_shift(int64_t j, int bits) {
  return static_cast<int>(bits * (j % int_codes_per_word(bits)));
}

// The value of code number j (0-based, in the block) of a block's code words.
LLMT_HOST_DEVICE inline float int_value(const int32_t* codes, int64_t j, float s, int bits) {
  const uint32_t w = static_cast<uint32_t>(codes[j / int_codes_per_word(bits)]);
  // The code's bits moved to the top, then shifted back down with the sign.
  const int32_t q = static_cast<int32_t>(w << (32 - bits - int_shift(j, bits))) >> (32 - bits);
  return s * static_cast<float>(q);
}

LLMT_HOST_DEVICE inline float int_bits_float(int32_t w) {
  return bits_float(static_cast<uint32_t>(w));
}

// Quantises one block's `len` values x into its bw words w (the scale, then the codes).
LLMT_HOST_DEVICE inline void int_quantize_block(int32_t* w, const float* x, int64_t len, int64_t bw,
                                                int bits) {
  float amax = 0.0f;
  for (int64_t j = 0; j < len; ++j) {  // NaN propagates (fmax would drop it)
    const float a = fabsf(x[j]);
    amax = a > amax || a != a ? a : amax;
  }
  const float s = int_scale(amax, bits);
  w[0] = static_cast<int32_t>(float_bits(s));
  for (int64_t j = 1; j < bw; ++j) w[j] = 0;
  const uint32_t mask = (1u << bits) - 1u;
  const int64_t per = int_codes_per_word(bits);
  for (int64_t j = 0; j < len; ++j)
    w[1 + j / per] = static_cast<int32_t>(
        static_cast<uint32_t>(w[1 + j / per]) |
        ((static_cast<uint32_t>(int_code(x[j], s, bits)) & mask) << int_shift(j, bits)));
}

}  // namespace llmt::kernel_math
