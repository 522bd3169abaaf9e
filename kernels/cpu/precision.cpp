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
  // A tile row at a time (the max is exact in any order).
  parallel_for(TR, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, tr * K)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t ti = begin; ti < end; ++ti) {
                   float* a = amax + ti * TC;
                   for (int64_t j = 0; j < TC; ++j) a[j] = 0.0f;
                   for (int64_t i = ti * tr; i < std::min(M, (ti + 1) * tr); ++i) {
                     const float* row = in + i * K;
                     for (int64_t j = 0; j < TC; ++j) {
                       float m = a[j];
                       for (int64_t k = j * tc; k < std::min(K, (j + 1) * tc); ++k)
                         m = std::max(m, std::fabs(row[k]));
                       a[j] = m;
                     }
                   }
                 }
               });
}

void fp8_quantize(float* out, const float* in, const float* amax, int64_t M, int64_t K, int64_t tr,
                  int64_t tc, int fmt) {
  const int64_t TC = (K + tc - 1) / tc;
  parallel_for(M, grain_rows(K), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* a = amax + (i / tr) * TC;
      for (int64_t j = 0; j < TC; ++j) {
        const float m = a[j];
        for (int64_t k = j * tc; k < std::min(K, (j + 1) * tc); ++k)
          out[i * K + k] = kernel_math::fp8_quantize_value(in[i * K + k], m, fmt);
      }
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
