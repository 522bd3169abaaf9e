// bf16/f16 rounding and conversion on known values: round-to-nearest-even ties, overflow to inf,
// f16 subnormals, NaN, and that every conversion path agrees with round_to. FP8 quantisation
// against fp8_reference.h's table of every value of each format.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "tests/unit/ops/fp8_reference.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rounds each value through `target` and checks the results exactly.
void expect_rounds(DType target, const std::vector<std::pair<float, float>>& cases) {
  const auto n = static_cast<int64_t>(cases.size());
  HostTensor x({n});
  for (int64_t i = 0; i < n; ++i) x[i] = cases[i].first;
  ops::round_to(x.t(), target);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(x[i], cases[i].second) << dtype_name(target) << " of " << cases[i].first;
}

TEST(RoundTo, Bf16NearestEven) {
  const float u = std::ldexp(1.0f, -8);  // half an ulp of bf16 at 1 (ulp 2^-7)
  expect_rounds(DType::bf16, {
                                 {1.0f, 1.0f},
                                 {1.0f + std::ldexp(1.0f, -9), 1.0f},  // below half: down
                                 {1.0f + u, 1.0f},                     // tie: to even
                                 {1.0f + 3 * u, 1.0f + 4 * u},         // tie: to even (up)
                                 {1.0f + u + std::ldexp(1.0f, -20), 1.0f + 2 * u},  // above half
                                 {-(1.0f + 3 * u), -(1.0f + 4 * u)},
                                 {std::numeric_limits<float>::max(), kInf},  // overflow
                                 {kInf, kInf},
                                 {0.0f, 0.0f},
                             });
  HostTensor nan({1});
  nan[0] = std::numeric_limits<float>::quiet_NaN();
  ops::round_to(nan.t(), DType::bf16);
  EXPECT_TRUE(std::isnan(nan[0]));
}

TEST(RoundTo, F16IeeeHalf) {
  const float sub = std::ldexp(1.0f, -24);  // smallest f16 subnormal
  expect_rounds(DType::f16, {
                                {1.0f, 1.0f},
                                {1.0f + std::ldexp(1.0f, -11), 1.0f},  // tie (ulp 2^-10): even
                                {1.0f / 3.0f, 0.333251953125f},
                                {65504.0f, 65504.0f},  // largest finite
                                {65519.0f, 65504.0f},
                                {65520.0f, kInf},  // tie with 2^16: overflow
                                {-70000.0f, -kInf},
                                {1e-7f, 2 * sub},  // subnormal: 1.68 ulps -> 2
                                {sub / 2, 0.0f},   // tie with 0: even
                                {0.75f * sub, sub},
                                {std::ldexp(1.0f, -14), std::ldexp(1.0f, -14)},  // smallest normal
                            });
}

TEST(RoundTo, F32IsIdentity) {
  HostTensor x = uniform({100}, 1), x0 = x;
  ops::round_to(x.t(), DType::f32);
  EXPECT_TRUE(bits_equal(x, x0));
}

TEST(Convert, KnownBits) {
  HostTensor x({4}), b({4}, DType::bf16), h({4}, DType::f16);
  x[0] = 1.0f, x[1] = -2.0f, x[2] = kInf, x[3] = 65520.0f;
  ops::convert(b.t(), x.t());
  ops::convert(h.t(), x.t());
  const uint16_t want_b[] = {0x3f80, 0xc000, 0x7f80, 0x4780};
  const uint16_t want_h[] = {0x3c00, 0xc000, 0x7c00, 0x7c00};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(b.u16()[i], want_b[i]) << i;
    EXPECT_EQ(h.u16()[i], want_h[i]) << i;
  }
}

// Every path f32 -> 16-bit -> f32 (and between 16-bit formats) equals rounding in place.
TEST(Convert, PathsAgreeWithRoundTo) {
  const int64_t n = 100003;
  HostTensor x = normal({n}, 2, 100.0f), back({n});
  for (DType t : {DType::bf16, DType::f16}) {
    HostTensor half({n}, t), rounded = x;
    ops::round_to(rounded.t(), t);
    ops::convert(half.t(), x.t());
    ops::convert(back.t(), half.t());
    EXPECT_TRUE(bits_equal(back, rounded)) << dtype_name(t);
    HostTensor same({n}, t);
    ops::convert(same.t(), half.t());
    EXPECT_TRUE(bits_equal(same, half)) << dtype_name(t);
  }
  // f16 -> bf16 is f16's value rounded to bf16.
  HostTensor h({n}, DType::f16), b({n}, DType::bf16), want = x;
  ops::round_to(want.t(), DType::f16);
  ops::round_to(want.t(), DType::bf16);
  ops::convert(h.t(), x.t());
  ops::convert(b.t(), h.t());
  ops::convert(back.t(), b.t());
  EXPECT_TRUE(bits_equal(back, want));
}

// With a tile whose amax is the format's largest value the scale is 1, so fp8_quantize rounds
// each value to the format: every value of the format, every midpoint between neighbours (ties:
// to the even code), just either side of each midpoint, subnormals and negatives.
TEST(Fp8, RoundsToTheNearestValueTiesToEven) {
  for (const bool e5m2 : {false, true}) {
    const Fp8Table& t = fp8_table(e5m2);
    std::vector<float> v{static_cast<float>(t.max)};
    for (size_t i = 0; i + 1 < t.value.size(); ++i) {
      const auto mid = static_cast<float>((t.value[i] + t.value[i + 1]) / 2);  // exact
      for (const float x : {static_cast<float>(t.value[i]), mid, std::nextafter(mid, 0.0f),
                            std::nextafter(mid, 1e9f)})
        for (const float sign : {1.0f, -1.0f}) v.push_back(sign * x);
    }
    const auto n = static_cast<int64_t>(v.size());
    HostTensor x({1, n}), out({1, n}), amax({1, 1});
    std::copy(v.begin(), v.end(), x.f32());
    const auto fmt = e5m2 ? ops::Fp8Format::e5m2 : ops::Fp8Format::e4m3;
    ops::fp8_amax(amax.t(), x.t(), 1, n);
    ASSERT_EQ(amax[0], t.max);
    ops::fp8_quantize(out.t(), x.t(), amax.t(), 1, n, fmt);
    int ties_up = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], fp8_nearest(v[i], e5m2)) << (e5m2 ? "E5M2" : "E4M3") << " of " << v[i];
      ties_up += out[i] > v[i] && v[i] > 0;
    }
    EXPECT_GT(ties_up, 10);  // the midpoints did round both ways
  }
  // The formats' ends: E4M3's smallest subnormal 2^-9 and largest 448, E5M2's 2^-16 and 57344.
  EXPECT_EQ(fp8_table(false).value[1], std::ldexp(1.0, -9));
  EXPECT_EQ(fp8_table(false).max, 448.0);
  EXPECT_EQ(fp8_table(true).value[1], std::ldexp(1.0, -16));
  EXPECT_EQ(fp8_table(true).max, 57344.0);
}

// Tiles of every shape the FP8 GEMMs use (1x128, 128x1, 128x128, whole) and an odd one, over a
// tensor with edge tiles and magnitudes from 1e-6 to 1e3 (so that small tiles get subnormal-free
// scales large ones cannot): amax and the quantised values equal the reference's bitwise, a bf16
// input equals its f32 copy, and an all-zero tile stays 0.
TEST(Fp8, TilesScaleByTheirOwnLargestValue) {
  const int64_t M = 150, K = 300;
  HostTensor x = normal({M, K}, 9);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      x[i * K + k] *= std::pow(10.0f, static_cast<float>((i + k) % 10) - 6);
  for (int64_t k = 0; k < 20; ++k) x[5 * K + k] = 0;  // a zero 1x16 tile at row 5
  HostTensor xb({M, K}, DType::bf16), xr = x;
  ops::round_to(xr.t(), DType::bf16);
  ops::convert(xb.t(), xr.t());
  for (const auto& [tr, tc] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 128}, {128, 1}, {128, 128}, {M, K}, {7, 5}, {1, 16}}) {
    const int64_t TR = (M + tr - 1) / tr, TC = (K + tc - 1) / tc;
    for (const bool e5m2 : {false, true}) {
      const auto fmt = e5m2 ? ops::Fp8Format::e5m2 : ops::Fp8Format::e4m3;
      HostTensor amax({TR, TC}), out({M, K}), outb({M, K}), amaxb({TR, TC});
      ops::fp8_amax(amax.t(), x.t(), tr, tc);
      ops::fp8_quantize(out.t(), x.t(), amax.t(), tr, tc, fmt);
      const std::vector<float> want = fp8_reference(x.f32(), M, K, tr, tc, e5m2);
      int64_t changed = 0;
      for (int64_t i = 0; i < M * K; ++i) {
        ASSERT_EQ(out[i], want[static_cast<size_t>(i)]) << tr << "x" << tc << " element " << i;
        changed += out[i] != x[i];
      }
      EXPECT_GT(changed, M * K / 2) << tr << "x" << tc;  // FP8 keeps 3 (2) mantissa bits
      for (int64_t i0 = 0; i0 < M; i0 += tr)
        for (int64_t k0 = 0; k0 < K; k0 += tc)
          ASSERT_EQ(amax[(i0 / tr) * TC + k0 / tc], fp8_tile_amax(x.f32(), M, K, i0, k0, tr, tc))
              << tr << "x" << tc;
      if (tr == 1 && tc == 16) {
        EXPECT_EQ(amax[5 * TC], 0.0f);
      }
      ops::fp8_amax(amaxb.t(), xb.t(), tr, tc);
      ops::fp8_quantize(outb.t(), xb.t(), amaxb.t(), tr, tc, fmt);
      const std::vector<float> wantb = fp8_reference(xr.f32(), M, K, tr, tc, e5m2);
      for (int64_t i = 0; i < M * K; ++i)
        ASSERT_EQ(outb[i], wantb[static_cast<size_t>(i)]) << "bf16 input, " << tr << "x" << tc;
    }
  }
}

// A NaN is no tile's amax (it would make every value of its tile NaN or 0): it stays NaN where
// it is, its tile scaled by the finite values; an inf is the amax, so its whole tile turns
// non-finite, which the run's non-finite checks see.
TEST(Fp8, NonFiniteValuesPropagate) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  HostTensor x({2, 4}), out({2, 4}), amax({2, 1});
  const float v[8] = {1.0f, nan, -3.0f, 0.3f, kInf, 2.0f, -0.5f, 0.0f};
  std::copy(v, v + 8, x.f32());
  ops::fp8_amax(amax.t(), x.t(), 1, 4);
  EXPECT_EQ(amax[0], 3.0f);
  EXPECT_EQ(amax[1], kInf);
  ops::fp8_quantize(out.t(), x.t(), amax.t(), 1, 4, ops::Fp8Format::e4m3);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], -3.0f);
  const float s = 3.0f / 448.0f;  // the finite values' scale
  EXPECT_EQ(out[0], s * fp8_nearest(1.0f / s, false));
  EXPECT_EQ(out[3], s * fp8_nearest(0.3f / s, false));
  for (int64_t i = 4; i < 8; ++i) EXPECT_FALSE(std::isfinite(out[i])) << i;
}

TEST(Fp8, RefusesBadTilesAndAliasing) {
  HostTensor x = normal({4, 8}, 1), out({4, 8}), amax({1, 1});
  EXPECT_THROW(ops::fp8_amax(amax.t(), x.t(), 0, 8), Error);
  EXPECT_THROW(ops::fp8_amax(HostTensor({2, 1}).t(), x.t(), 4, 8), Error);  // wrong tile grid
  ops::fp8_amax(amax.t(), x.t(), 4, 8);
  EXPECT_THROW(ops::fp8_quantize(x.t(), x.t(), amax.t(), 4, 8, ops::Fp8Format::e4m3), Error);
  EXPECT_THROW(ops::fp8_quantize(out.t(), x.t().view({32}), amax.t(), 4, 8, ops::Fp8Format::e4m3),
               Error);
}

// Integer block quantisation against a reference written here, in 8 and 4 bits: per block the
// scale amax/Q (Q = 127, 7), each code nearbyint(v / s) clamped to +-Q in its bits of the packed
// words (32/bits to a word), and the values read back s * q, within half a step of v. Blocks of
// 1, 4, 7 and 256 over rows no multiple of them.
TEST(IntQuant, BlocksQuantiseToTheirOwnScale) {
  const int64_t S = 2, L = 1003;
  HostTensor x = normal({S, L}, 11);
  for (int64_t i = 0; i < L; i += 5) x[i] *= 100.0f;  // blocks of very different ranges
  for (const int bits : {8, 4}) {
    const int per = 32 / bits;
    const float Q = bits == 8 ? 127.0f : 7.0f;
    for (int64_t block : {int64_t{1}, int64_t{4}, int64_t{7}, int64_t{256}}) {
      const int64_t nb = (L + block - 1) / block, bw = 1 + (block + per - 1) / per;
      ASSERT_EQ(ops::int_packed_words(L, block, bits), nb * bw);
      HostTensor packed({S, nb * bw}, DType::i32), back({S, L});
      ops::quantize_int(packed.t(), x.t(), block, bits);
      ops::dequantize_int(back.t(), packed.t(), block, bits);
      for (int64_t r = 0; r < S; ++r)
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t begin = r * L + b * block, len = std::min(block, L - b * block);
          float amax = 0.0f;
          for (int64_t j = 0; j < len; ++j) amax = std::max(amax, std::fabs(x[begin + j]));
          const float s = amax / Q;
          const int32_t* w = packed.i32() + (r * nb + b) * bw;
          ASSERT_EQ(std::bit_cast<float>(w[0]), s) << bits << " bits, block " << block;
          for (int64_t j = 0; j < (bw - 1) * per; ++j) {
            // The code's bits, sign-extended.
            const uint32_t raw =
                (static_cast<uint32_t>(w[1 + j / per]) >> (bits * (j % per))) & ((1u << bits) - 1);
            const int32_t code = raw >= (1u << (bits - 1)) ? static_cast<int32_t>(raw) - (1 << bits)
                                                           : static_cast<int32_t>(raw);
            if (j >= len) {
              EXPECT_EQ(code, 0) << "padding code " << j;
              continue;
            }
            const float v = x[begin + j];
            const float q = std::clamp(std::nearbyint(v / s), -Q, Q);
            ASSERT_EQ(code, static_cast<int32_t>(q)) << v << " in a block of scale " << s;
            EXPECT_EQ(back[begin + j], s * q);
            EXPECT_LE(std::fabs(back[begin + j] - v), 0.5f * s * (1 + 1e-6f)) << v;
          }
        }
      // 16-bit output: the f32 values rounded to the type.
      HostTensor b16({S, L}, DType::bf16), widened({S, L});
      ops::dequantize_int(b16.t(), packed.t(), block, bits);
      ops::convert(widened.t(), b16.t());
      ops::round_to(back.t(), DType::bf16);
      for (int64_t i = 0; i < S * L; ++i) ASSERT_EQ(widened[i], back[i]) << i;
    }
  }
}

// A zero block reads back 0 (scale 0); a block holding inf or NaN reads back NaN in every value
// (never plausible values), its neighbours unchanged.
TEST(IntQuant, ZeroAndNonFiniteBlocks) {
  for (const int bits : {8, 4}) {
    HostTensor x({1, 12});
    for (int64_t i = 0; i < 12; ++i) x[i] = static_cast<float>(i) - 5.5f;
    for (int64_t i = 4; i < 8; ++i) x[i] = 0.0f;
    x[9] = std::numeric_limits<float>::quiet_NaN();
    HostTensor packed({1, ops::int_packed_words(12, 4, bits)}, DType::i32), back({1, 12});
    ops::quantize_int(packed.t(), x.t(), 4, bits);
    ops::dequantize_int(back.t(), packed.t(), 4, bits);
    for (int64_t i = 4; i < 8; ++i) EXPECT_EQ(back[i], 0.0f);
    for (int64_t i = 8; i < 12; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
    EXPECT_EQ(back[0], -5.5f);  // the largest of its block: code -Q, s = 5.5 / Q
    x[9] = kInf;
    ops::quantize_int(packed.t(), x.t(), 4, bits);
    ops::dequantize_int(back.t(), packed.t(), 4, bits);
    for (int64_t i = 8; i < 12; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
  }
}

TEST(IntQuant, RefusesBadShapes) {
  HostTensor x({2, 10}), packed({2, ops::int_packed_words(10, 4, 8)}, DType::i32);
  EXPECT_THROW(ops::quantize_int(packed.t(), x.t(), 0, 8), Error);
  EXPECT_THROW(ops::quantize_int(packed.t(), x.t(), 3, 8), Error);  // 4 blocks of 2 words, not 3
  EXPECT_THROW(ops::quantize_int(packed.t(), x.t().view({20}), 4, 8), Error);
  HostTensor p16({2, ops::int_packed_words(10, 16, 8)}, DType::i32);  // 1 block of 5 words
  EXPECT_THROW(ops::quantize_int(p16.t(), x.t(), 16, 4), Error);      // int4: 1 block of 3 words
  EXPECT_THROW(ops::quantize_int(packed.t(), x.t(), 4, 2), Error);    // 8 or 4 bits
  HostTensor f({2, ops::int_packed_words(10, 4, 8)});
  EXPECT_THROW(ops::quantize_int(f.t(), x.t(), 4, 8), Error);  // packed must be i32
}

}  // namespace
}  // namespace llmt::test
