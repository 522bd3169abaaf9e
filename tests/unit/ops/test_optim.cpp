// AdamW against the hand-written formula (docs/model.md) over successive steps, and the
// reductions the optimizer relies on: sum_squares in double, has_nonfinite for inf and nan.
#include <cmath>
#include <limits>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

class AdamW : public ::testing::TestWithParam<int64_t> {};

TEST_P(AdamW, StepsMatchHandFormula) {
  const int64_t n = GetParam();
  const ops::AdamWParams base{
      .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1};
  HostTensor p = uniform({n}, 1), m({n}), v({n});
  std::vector<double> rp = to_double(p), rm(n, 0.0), rv(n, 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    HostTensor g = uniform({n}, 10 + step);
    ops::AdamWParams hp = base;
    hp.step = step;
    ops::adamw_update(p.t(), g.t(), m.t(), v.t(), hp);
    const double b1 = hp.beta1, b2 = hp.beta2;
    for (int64_t i = 0; i < n; ++i) {
      rm[i] = b1 * rm[i] + (1 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - b2) * g[i] * g[i];
      const double mhat = rm[i] / (1 - std::pow(b1, step)), vhat = rv[i] / (1 - std::pow(b2, step));
      rp[i] -= hp.lr * (hp.weight_decay * rp[i] + mhat / (std::sqrt(vhat) + hp.eps));
    }
    EXPECT_TRUE(all_close(m, rm, {1e-6, 1e-7})) << "step " << step;
    EXPECT_TRUE(all_close(v, rv, {1e-5, 1e-9})) << "step " << step;
    EXPECT_TRUE(all_close(p, rp, {1e-6, 1e-7})) << "step " << step;
  }
}

TEST_P(AdamW, GradScaleEqualsPrescaledGradient) {
  const int64_t n = GetParam();
  ops::AdamWParams hp{
      .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1};
  HostTensor p1 = uniform({n}, 1), p2 = p1, m1({n}), v1({n}), m2({n}), v2({n});
  HostTensor g = uniform({n}, 4), g_half = g;
  for (int64_t i = 0; i < n; ++i) g_half[i] = g[i] * 0.25f;  // exact: a power of two
  ops::adamw_update(p1.t(), g_half.t(), m1.t(), v1.t(), hp);
  hp.grad_scale = 0.25f;
  ops::adamw_update(p2.t(), g.t(), m2.t(), v2.t(), hp);
  EXPECT_TRUE(bits_equal(p1, p2));
  EXPECT_TRUE(bits_equal(m1, m2));
  EXPECT_TRUE(bits_equal(v1, v2));
}

TEST_P(AdamW, SumSquaresInDouble) {
  const int64_t n = GetParam();
  HostTensor x = uniform({n}, 2, -3.0f, 3.0f);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) ref += static_cast<double>(x[i]) * x[i];
  EXPECT_NEAR(ops::sum_squares(x.t()), ref, 1e-12 * ref);
}

TEST_P(AdamW, HasNonfinite) {
  const int64_t n = GetParam();
  HostTensor x = uniform({n}, 3, -1e30f, 1e30f);
  EXPECT_FALSE(ops::has_nonfinite(x.t()));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    HostTensor y = x;
    y[n - 1] = bad;
    EXPECT_TRUE(ops::has_nonfinite(y.t())) << bad;
    y = x;
    y[n / 2] = bad;
    EXPECT_TRUE(ops::has_nonfinite(y.t())) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AdamW, ::testing::Values(1, 67, 100003), ParamName());

}  // namespace
}  // namespace llmt::test
