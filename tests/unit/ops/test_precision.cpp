// bf16/f16 rounding and conversion on known values: round-to-nearest-even ties, overflow to inf,
// f16 subnormals, NaN, and that every conversion path agrees with round_to.
#include <bit>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/ops.h"
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

}  // namespace
}  // namespace llmt::test
