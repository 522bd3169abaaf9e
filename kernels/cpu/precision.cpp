// bf16 / f16 storage emulation. Each format is a tiny codec (load to f32, store from f32 with
// round-to-nearest-even) and every conversion or rounding is one vectorisable loop over a pair of
// codecs. f16 uses the compiler's _Float16 (F16C instructions where available): IEEE half
// including subnormals and overflow to inf.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/fp8_math.h"
#include "kernels/int_quant_math.h"

namespace llmt::cpu {
namespace {

struct F32 {
  using Storage = float;
  static float load(float x) { return x; }
  static float store(float x) { return x; }
};

struct BF16 {
  using Storage = uint16_t;
  static float load(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
  // Round to nearest even on the top 16 bits; a NaN stays a (quiet) NaN instead of rounding
  // into inf. Finite values past the largest bf16 round to inf as they should.
  static uint16_t store(float x) {
    const uint32_t b = std::bit_cast<uint32_t>(x);
    const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = b + 0x7fffu + ((b >> 16) & 1u);
    return static_cast<uint16_t>((nan ? b | 0x00400000u : rounded) >> 16);
  }
};

struct F16 {
  using Storage = uint16_t;
  static float load(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
  static uint16_t store(float x) { return std::bit_cast<uint16_t>(static_cast<_Float16>(x)); }
};

template <typename Src, typename Dst>
void convert_as(void* dst, const void* src, int64_t n) {
  auto* d = static_cast<typename Dst::Storage*>(dst);
  const auto* s = static_cast<const typename Src::Storage*>(src);
  parallel_for(n, kGrainElems, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) d[i] = Dst::store(Src::load(s[i]));
  });
}

// x (n) f32 = the nearest value of Fmt.
template <typename Fmt>
void round_through(float* x, int64_t n) {
  parallel_for(n, kGrainElems, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) x[i] = Fmt::load(Fmt::store(x[i]));
  });
}

// Calls f with the codec of t.
template <typename F>
void with_codec(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(F32{});
    case DType::bf16:
      return f(BF16{});
    case DType::f16:
      return f(F16{});
    case DType::i32:
    case DType::f64:
      break;
  }
  LLMT_CHECK(false, "convert: ", dtype_name(t), " is not a floating-point storage type");
}

}  // namespace

void round_to_bf16(float* x, int64_t n) {
  round_through<BF16>(x, n);
}

void round_to_f16(float* x, int64_t n) {
  round_through<F16>(x, n);
}

void fp8_amax(float* amax, const float* in, int64_t M, int64_t K, int64_t tr, int64_t tc) {
  const int64_t TR = (M + tr - 1) / tr, TC = (K + tc - 1) / tc;
  // A tile row at a time; the max of the magnitudes' bits (kernel_math::abs_bits), exact in any
  // order and vectorised.
  parallel_for(TR, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, tr * K)),
               [&](int64_t begin, int64_t end) {
                 std::vector<uint32_t> m(static_cast<size_t>(TC));
                 for (int64_t ti = begin; ti < end; ++ti) {
                   std::fill(m.begin(), m.end(), 0u);
                   for (int64_t i = ti * tr; i < std::min(M, (ti + 1) * tr); ++i) {
                     const float* row = in + i * K;
                     if (tc == 1) {  // a column's tile: down the rows, vectorised along them
                       uint32_t* mk = m.data();
#pragma omp simd
                       for (int64_t k = 0; k < K; ++k)
                         mk[k] = std::max(mk[k], kernel_math::abs_bits(row[k]));
                       continue;
                     }
                     for (int64_t j = 0; j < TC; ++j) {
                       uint32_t mj = m[j];
#pragma omp simd reduction(max : mj)
                       for (int64_t k = j * tc; k < std::min(K, (j + 1) * tc); ++k)
                         mj = std::max(mj, kernel_math::abs_bits(row[k]));
                       m[j] = mj;
                     }
                   }
                   for (int64_t j = 0; j < TC; ++j)
                     amax[ti * TC + j] = kernel_math::bits_float(m[j]);
                 }
               });
}

void fp8_quantize(float* out, const float* in, const float* amax, int64_t M, int64_t K, int64_t tr,
                  int64_t tc, int fmt) {
  const int64_t TC = (K + tc - 1) / tc;
  const float fmax = kernel_math::fp8_spec(fmt).max;
  parallel_for(M, grain_rows(K), [&](int64_t begin, int64_t end) {
    std::vector<float> scale(tc == 1 ? static_cast<size_t>(K) : 0);
    for (int64_t i = begin; i < end; ++i) {
      const float* a = amax + (i / tr) * TC;
      if (tc == 1) {  // a scale per column (tiles down the rows), vectorised along the row
        float* sc = scale.data();
        float* o = out + i * K;
        const float* x = in + i * K;
#pragma omp simd
        for (int64_t k = 0; k < K; ++k) sc[k] = a[k] / fmax;
#pragma omp simd
        for (int64_t k = 0; k < K; ++k) {
          const float q = sc[k] * kernel_math::fp8_round(x[k] / sc[k], fmt);
          o[k] = a[k] > 0.0f ? q : 0.0f;  // kernel_math::fp8_quantize_value's zero tile
        }
        continue;
      }
      for (int64_t j = 0; j < TC; ++j) {
        const int64_t k0 = j * tc, k1 = std::min(K, (j + 1) * tc);
        float* o = out + i * K;
        const float* x = in + i * K;
        if (!(a[j] > 0.0f)) {  // kernel_math::fp8_quantize_value's zero tile
          std::fill(o + k0, o + k1, 0.0f);
          continue;
        }
        const float s = a[j] / fmax;
#pragma omp simd
        for (int64_t k = k0; k < k1; ++k) o[k] = s * kernel_math::fp8_round(x[k] / s, fmt);
      }
    }
  });
}

void quantize_int(int32_t* packed, const float* in, int64_t S, int64_t L, int64_t B, int bits) {
  const int64_t nb = (L + B - 1) / B, bw = kernel_math::int_block_words(B, bits);
  parallel_for(S * nb, std::max<int64_t>(1, grain_rows(B)), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t row = k / nb, b = k % nb, len = std::min(B, L - b * B);
      kernel_math::int_quantize_block(packed + k * bw, in + row * L + b * B, len, bw, bits);
    }
  });
}

void dequantize_int(float* out, const int32_t* packed, int64_t S, int64_t L, int64_t B, int bits) {
  const int64_t nb = (L + B - 1) / B, bw = kernel_math::int_block_words(B, bits);
  parallel_for(S * nb, std::max<int64_t>(1, grain_rows(B)), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t row = k / nb, b = k % nb, len = std::min(B, L - b * B);
      const int32_t* w = packed + k * bw;
      const float s = kernel_math::int_bits_float(w[0]);
      float* o = out + row * L + b * B;
      for (int64_t j = 0; j < len; ++j) o[j] = kernel_math::int_value(w + 1, j, s, bits);
    }
  });
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  with_codec(src_type, [&](auto s) {
    with_codec(dst_type, [&](auto d) { convert_as<decltype(s), decltype(d)>(dst, src, n); });
  });
}

void* op_scratch(int slot, size_t bytes) {
  struct Block {
    std::unique_ptr<float[]> data;
    size_t bytes = 0;
  };
  thread_local std::vector<Block> blocks;
  if (blocks.size() <= static_cast<size_t>(slot)) blocks.resize(static_cast<size_t>(slot) + 1);
  Block& b = blocks[static_cast<size_t>(slot)];
  if (b.bytes < bytes) {
    b.data = std::make_unique_for_overwrite<float[]>((bytes + 3) / 4);
    b.bytes = bytes;
  }
  return b.data.get();
}

}  // namespace llmt::cpu
