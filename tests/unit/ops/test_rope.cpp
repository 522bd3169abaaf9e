// RoPE (rotate half) against a double-precision rotation, including large positions, untouched
// non-rotated heads, backward = inverse rotation, and finite differences of the backward; its
// scaled frequencies (linear, Llama 3.1's, YaRN's) against references written from the papers.
#include <algorithm>
#include <cmath>
#include <ostream>
#include <vector>

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

// ---- scaled frequencies ----------------------------------------------------------------------
// References written from the publications, not from kernels/rope_math.h: Llama 3.1's
// apply_scaling (Meta's reference code: wavelength bands of the original context) and YaRN
// (Peng et al. 2023, §3.2 "NTK-by-parts" with DeepSeek-V3's correction range and ramp, §3.4 the
// attention factor 0.1 ln s + 1).

std::vector<double> base_freqs(double theta, int64_t R) {
  std::vector<double> f(R / 2);
  for (int64_t i = 0; i < R / 2; ++i) f[i] = 1.0 / std::pow(theta, 2.0 * i / R);
  return f;
}

std::vector<double> llama3_freqs(double theta, int64_t R, double factor, double low, double high,
                                 double old_len) {
  std::vector<double> out;
  for (const double f : base_freqs(theta, R)) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < old_len / high) {
      out.push_back(f);
    } else if (wavelen > old_len / low) {
      out.push_back(f / factor);
    } else {
      const double smooth = (old_len / wavelen - low) / (high - low);
      out.push_back((1 - smooth) * f / factor + smooth * f);
    }
  }
  return out;
}

std::vector<double> yarn_freqs(double theta, int64_t R, double factor, double beta_fast,
                               double beta_slow, double old_len) {
  // The dim whose pair turns `rot` times over the original context.
  auto dim = [&](double rot) {
    return R * std::log(old_len / (rot * 2 * M_PI)) / (2 * std::log(theta));
  };
  const double lo = std::max(std::floor(dim(beta_fast)), 0.0);
  double hi = std::min(std::ceil(dim(beta_slow)), static_cast<double>(R - 1));
  if (hi == lo) hi += 0.001;
  std::vector<double> f = base_freqs(theta, R), out;
  for (int64_t i = 0; i < R / 2; ++i) {
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);  // 1: interpolate
    out.push_back(f[i] / factor * ramp + f[i] * (1 - ramp));
  }
  return out;
}

// The rotation of `c` at frequencies `freq`, cos and sin times `mag`.
std::vector<double> rotate_at(const RopeCase& c, const HostTensor& x,
                              const std::vector<double>& freq, double mag) {
  std::vector<double> out = to_double(x);
  const int64_t half = c.R() / 2;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t h = 0; h < c.n_rot; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(c.pos_offset + t) * freq[i];
          const double co = mag * std::cos(angle), si = mag * std::sin(angle);
          const int64_t lo = ((b * c.T + t) * c.HT + h) * c.D + c.first + i, hi = lo + half;
          out[lo] = x[lo] * co - x[hi] * si;
          out[hi] = x[hi] * co + x[lo] * si;
        }
  return out;
}

struct ScaledCase {
  const char* name;
  float theta;
  RopeScaling s;
  std::vector<double> freq;  // the reference's
  double mag;                // cos/sin factor
};

std::vector<ScaledCase> scaled_cases(int64_t R) {
  RopeScaling linear;
  linear.rope_type = RopeType::linear;
  linear.factor = 4.0f;
  // Llama 3.1 8B's (theta 500000, factor 8, bands 1 and 4 of an 8192 context); with R = 32 the
  // pairs fall in all three bands.
  RopeScaling llama3;
  llama3.rope_type = RopeType::llama3;
  llama3.factor = 8.0f;
  llama3.original_max_position_embeddings = 8192;
  llama3.low_freq_factor = 1.0f;
  llama3.high_freq_factor = 4.0f;
  // DeepSeek-V3's (factor 40 over 4096, beta 32 / 1, mscale = mscale_all_dim = 1: cos/sin
  // unscaled), and plain YaRN (no mscale_all_dim: cos/sin times 0.1 ln 16 + 1).
  RopeScaling v3;
  v3.rope_type = RopeType::yarn;
  v3.factor = 40.0f;
  v3.original_max_position_embeddings = 4096;
  v3.mscale = 1.0f;
  v3.mscale_all_dim = 1.0f;
  RopeScaling yarn = v3;
  yarn.factor = 16.0f;
  yarn.mscale_all_dim = 0.0f;
  std::vector<double> lin = base_freqs(10000.0, R);
  for (double& f : lin) f /= 4.0;
  return {{"linear", 10000.0f, linear, lin, 1.0},
          {"llama3", 500000.0f, llama3, llama3_freqs(500000.0, R, 8, 1, 4, 8192), 1.0},
          {"yarn_v3", 10000.0f, v3, yarn_freqs(10000.0, R, 40, 32, 1, 4096), 1.0},
          {"yarn", 10000.0f, yarn, yarn_freqs(10000.0, R, 16, 32, 1, 4096),
           0.1 * std::log(16.0) + 1.0}};
}

// Forward against the reference rotation (positions past the original context, where scaling
// matters), backward inverts it up to the factor squared, finite differences of the backward; and
// the bands and ramp really split the pairs (a reference that scaled every pair alike would pass
// the kernel otherwise).
TEST(RopeScaling, MatchesThePublishedFrequencies) {
  const RopeCase c{2, 5, 3, 40, 2, 9000, 4, 32};  // R = 32 dims of 40, positions 9000..9004
  for (const ScaledCase& k : scaled_cases(c.R())) {
    HostTensor x = uniform({c.B, c.T, c.HT, c.D}, 5), x0 = x;
    ops::rope_forward(x.t(), c.n_rot, c.pos_offset, k.theta, {}, c.dims(), k.s);
    EXPECT_TRUE(all_close(x, rotate_at(c, x0, k.freq, k.mag), {2e-6, 2e-6})) << k.name;
    ops::rope_backward(x.t(), c.n_rot, c.pos_offset, k.theta, {}, c.dims(), k.s);
    std::vector<double> back = to_double(x0);
    for (int64_t r = 0; r < c.B * c.T; ++r)
      for (int64_t h = 0; h < c.n_rot; ++h)
        for (int64_t i = 0; i < c.R(); ++i)
          back[(r * c.HT + h) * c.D + c.first + i] *= k.mag * k.mag;
    EXPECT_TRUE(all_close(x, back, {2e-6, 2e-6})) << k.name;
    HostTensor w = uniform({c.B, c.T, c.HT, c.D}, 6), dx = w, y;
    ops::rope_backward(dx.t(), c.n_rot, c.pos_offset, k.theta, {}, c.dims(), k.s);
    auto loss = [&] {
      y = x0;
      ops::rope_forward(y.t(), c.n_rot, c.pos_offset, k.theta, {}, c.dims(), k.s);
      return weighted_sum(y, w);
    };
    EXPECT_TRUE(check_gradient(loss, x0, dx)) << k.name;
    const std::vector<double> f = base_freqs(k.theta, c.R());
    int kept = 0, divided = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      kept += std::abs(k.freq[i] / f[i] - 1) < 1e-12;
      divided += std::abs(k.freq[i] / f[i] * k.s.factor - 1) < 1e-12;
    }
    if (k.s.rope_type != RopeType::linear) {
      EXPECT_GT(kept, 0) << k.name;
      EXPECT_GT(divided, 0) << k.name;
      EXPECT_LT(kept + divided, static_cast<int>(f.size())) << k.name << ": no pair in between";
    }
  }
}

// Without scaling the kernel is bitwise what it was: RopeScaling{} is the default.
TEST(RopeScaling, NoneIsTheUnscaledRotation) {
  const RopeCase c{2, 6, 3, 16, 2, 5};
  HostTensor a = uniform({c.B, c.T, c.HT, c.D}, 7), b = a;
  ops::rope_forward(a.t(), c.n_rot, c.pos_offset, kTheta);
  ops::rope_forward(b.t(), c.n_rot, c.pos_offset, kTheta, {}, {}, RopeScaling{});
  EXPECT_TRUE(bits_equal(a, b));
}

}  // namespace
}  // namespace llmt::test
