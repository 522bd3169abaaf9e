// GELU (tanh) and SwiGLU against double-precision formulas over a wide input range (the tails
// exercise the exp-based tanh/sigmoid), in-place GELU, and finite differences of both backwards.
#include <cmath>
#include <ostream>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

const double kS = std::sqrt(2.0 / M_PI), kK = 0.044715;

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kS * (x + kK * x * x * x)));
}

double gelu_grad(double x) {
  const double t = std::tanh(kS * (x + kK * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kS * (1.0 + 3.0 * kK * x * x);
}

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Absolute error of about 2 ulp of the larger terms, relative 1e-5 elsewhere.
constexpr Tol kActTol{1e-5, 1e-6};

class Gelu : public ::testing::TestWithParam<int64_t> {};

TEST_P(Gelu, ForwardBackwardMatchReference) {
  const int64_t n = GetParam();
  HostTensor x = uniform({n}, 1, -8.0f, 8.0f), out({n}), dout = uniform({n}, 2), dinp({n});
  std::vector<double> ref(n), ref_grad(n);
  for (int64_t i = 0; i < n; ++i) {
    ref[i] = gelu(x[i]);
    ref_grad[i] = dout[i] * gelu_grad(x[i]);
  }
  ops::gelu_forward(out.t(), x.t());
  EXPECT_TRUE(all_close(out, ref, kActTol));
  ops::gelu_backward(dinp.t(), dout.t(), x.t());
  EXPECT_TRUE(all_close(dinp, ref_grad, kActTol));
  ops::gelu_forward(x.t(), x.t());  // out aliases inp
  EXPECT_TRUE(bits_equal(x, out));
}

TEST_P(Gelu, GradientMatchesFiniteDifferences) {
  const int64_t n = GetParam();
  HostTensor x = uniform({n}, 3, -4.0f, 4.0f), out({n}), w = uniform({n}, 4), dinp({n});
  ops::gelu_backward(dinp.t(), w.t(), x.t());
  auto loss = [&] {
    ops::gelu_forward(out.t(), x.t());
    return weighted_sum(out, w);
  };
  EXPECT_TRUE(check_gradient(loss, x, dinp));
}

INSTANTIATE_TEST_SUITE_P(Sizes, Gelu, ::testing::Values(1, 67, 100003), ParamName());

TEST(GeluOps, LargeInputsSaturate) {
  HostTensor x({4}), out({4});
  x[0] = 100.0f, x[1] = -100.0f, x[2] = 1e30f, x[3] = -1e30f;
  ops::gelu_forward(out.t(), x.t());
  EXPECT_EQ(out[0], 100.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 1e30f);
  EXPECT_EQ(out[3], 0.0f);
}

struct SwigluCase {
  int64_t N, F;
};

std::ostream& operator<<(std::ostream& os, const SwigluCase& c) {
  return os << "N" << c.N << "_F" << c.F;
}

class Swiglu : public ::testing::TestWithParam<SwigluCase> {};

TEST_P(Swiglu, ForwardBackwardMatchReference) {
  const auto [N, F] = GetParam();
  HostTensor inp = uniform({N, 2 * F}, 1, -8.0f, 8.0f), out({N, F}), dout = uniform({N, F}, 2);
  HostTensor dinp = uniform({N, 2 * F}, 3);  // assigned
  std::vector<double> ref(N * F), ref_grad(N * 2 * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f], s = sigmoid(g);
      const double d = dout[n * F + f];
      ref[n * F + f] = g * s * u;
      ref_grad[n * 2 * F + f] = d * u * (s + g * s * (1.0 - s));
      ref_grad[n * 2 * F + F + f] = d * g * s;
    }
  ops::swiglu_forward(out.t(), inp.t());
  EXPECT_TRUE(all_close(out, ref, kActTol));
  ops::swiglu_backward(dinp.t(), dout.t(), inp.t());
  EXPECT_TRUE(all_close(dinp, ref_grad, kActTol));
}

TEST_P(Swiglu, GradientMatchesFiniteDifferences) {
  const auto [N, F] = GetParam();
  HostTensor inp = uniform({N, 2 * F}, 4, -4.0f, 4.0f), out({N, F}), w = uniform({N, F}, 5);
  HostTensor dinp({N, 2 * F});
  ops::swiglu_backward(dinp.t(), w.t(), inp.t());
  auto loss = [&] {
    ops::swiglu_forward(out.t(), inp.t());
    return weighted_sum(out, w);
  };
  EXPECT_TRUE(check_gradient(loss, inp, dinp));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Swiglu,
                         ::testing::Values(SwigluCase{1, 1}, SwigluCase{3, 67},
                                           SwigluCase{64, 300}),
                         ParamName());

}  // namespace
}  // namespace llmt::test
