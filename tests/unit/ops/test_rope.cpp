// RoPE (rotate half) against a double-precision rotation, including large positions, untouched
// non-rotated heads, backward = inverse rotation, and finite differences of the backward.
#include <cmath>
#include <ostream>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

struct RopeCase {
  int64_t B, T, HT, D, n_rot, pos_offset;
  int64_t first = 0, count = 0;  // the rotated dims of each head (count 0: all D)
  int64_t R() const { return count == 0 ? D : count; }
  ops::RopeDims dims() const { return {first, count}; }
};

std::ostream& operator<<(std::ostream& os, const RopeCase& c) {
  return os << "B" << c.B << "_T" << c.T << "_HT" << c.HT << "_D" << c.D << "_rot" << c.n_rot
            << "_off" << c.pos_offset << "_dims" << c.first << "_" << c.R();
}

constexpr float kTheta = 10000.0f;

std::vector<double> rotate(const RopeCase& c, const HostTensor& x) {
  std::vector<double> out = to_double(x);
  const int64_t half = c.R() / 2;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t h = 0; h < c.n_rot; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double angle =
              static_cast<double>(c.pos_offset + t) * std::pow(double{kTheta}, -2.0 * i / c.R());
          const int64_t lo = ((b * c.T + t) * c.HT + h) * c.D + c.first + i, hi = lo + half;
          out[lo] = x[lo] * std::cos(angle) - x[hi] * std::sin(angle);
          out[hi] = x[hi] * std::cos(angle) + x[lo] * std::sin(angle);
        }
  return out;
}

class Rope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(Rope, ForwardMatchesReferenceAndKeepsOtherHeads) {
  const auto& c = GetParam();
  HostTensor x = uniform({c.B, c.T, c.HT, c.D}, 1), x0 = x;
  ops::rope_forward(x.t(), c.n_rot, c.pos_offset, kTheta, {}, c.dims());
  // cos/sin are rounded to f32: absolute error ~1e-7 per term.
  EXPECT_TRUE(all_close(x, rotate(c, x0), {1e-6, 1e-6}));
  // Every element outside the rotated heads and dims is untouched.
  for (int64_t r = 0; r < c.B * c.T; ++r)
    for (int64_t k = 0; k < c.HT * c.D; ++k) {
      const int64_t h = k / c.D, i = k % c.D;
      if (h < c.n_rot && i >= c.first && i < c.first + c.R()) continue;
      ASSERT_EQ(x[r * c.HT * c.D + k], x0[r * c.HT * c.D + k]) << "row " << r << " element " << k;
    }
}

TEST_P(Rope, BackwardInvertsForward) {
  const auto& c = GetParam();
  HostTensor x = uniform({c.B, c.T, c.HT, c.D}, 2), x0 = x;
  ops::rope_forward(x.t(), c.n_rot, c.pos_offset, kTheta, {}, c.dims());
  ops::rope_backward(x.t(), c.n_rot, c.pos_offset, kTheta, {}, c.dims());
  EXPECT_TRUE(all_close(x, x0, {1e-6, 1e-6}));
}

TEST_P(Rope, GradientMatchesFiniteDifferences) {
  const auto& c = GetParam();
  HostTensor x = uniform({c.B, c.T, c.HT, c.D}, 3), w = uniform({c.B, c.T, c.HT, c.D}, 4);
  HostTensor dx = w, y;
  ops::rope_backward(dx.t(), c.n_rot, c.pos_offset, kTheta, {}, c.dims());
  auto loss = [&] {
    y = x;
    ops::rope_forward(y.t(), c.n_rot, c.pos_offset, kTheta, {}, c.dims());
    return weighted_sum(y, w);
  };
  EXPECT_TRUE(check_gradient(loss, x, dx));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Rope,
                         ::testing::Values(RopeCase{1, 1, 1, 2, 1, 0}, RopeCase{2, 5, 3, 8, 2, 7},
                                           RopeCase{2, 17, 6, 64, 4, 100},
                                           RopeCase{1, 3, 2, 16, 0, 0},
                                           RopeCase{1, 9, 3, 32, 3, 4000},
                                           // Latent attention's rope part: the last 8 of 24
                                           // dims, and a run in the middle.
                                           RopeCase{2, 7, 5, 24, 4, 3, 16, 8},
                                           RopeCase{1, 5, 2, 12, 2, 0, 2, 6}),
                         ParamName());

}  // namespace
}  // namespace llmt::test
