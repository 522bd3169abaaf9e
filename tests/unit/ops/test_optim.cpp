// AdamW against the hand-written formula (docs/model.md) over successive steps, and the
// reductions the optimizer relies on: sum_squares in double, has_nonfinite for inf and nan; the
// multi-tensor (list) versions against the per-tensor ones, bitwise.
#include <cmath>
#include <iterator>
#include <limits>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "kernels/threads.h"
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

// The multi-tensor ops against the per-tensor ops, bitwise, on lists of uneven sizes: empty, one
// element, across the CPU's 16384-element pieces and its per-thread chunks (sizes >= 32768 are
// split over threads), with weight decay on and off; at 1 and 3 threads (more than this
// machine's cores: the dynamic hand-out of pieces then varies from run to run).
class MultiTensor : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { set_cpu_threads(GetParam()); }
  void TearDown() override { set_cpu_threads(saved_threads_); }

  static constexpr int64_t kSizes[] = {0, 1, 67, 16384, 16385, 0, 100003, 5, 40000, 70001};
  static constexpr size_t kCount = std::size(kSizes);

  // The view of x, or an empty tensor for an empty HostTensor (which has no view).
  static Tensor view(HostTensor& x, int64_t n) {
    return n == 0 ? Tensor(nullptr, {0}, DType::f32) : x.t();
  }
  static std::vector<HostTensor> list(uint64_t seed, float lo, float hi) {
    std::vector<HostTensor> xs;
    for (size_t k = 0; k < kCount; ++k) xs.push_back(uniform({kSizes[k]}, seed + k, lo, hi));
    return xs;
  }
  static std::vector<Tensor> views(std::vector<HostTensor>& xs) {
    std::vector<Tensor> vs;
    for (size_t k = 0; k < kCount; ++k) vs.push_back(view(xs[k], kSizes[k]));
    return vs;
  }

 private:
  int saved_threads_ = cpu_threads();
};

TEST_P(MultiTensor, AdamWListIsBitwisePerTensor) {
  std::vector<HostTensor> p1 = list(1, -1.0f, 1.0f), m1 = list(20, -0.1f, 0.1f),
                          v1 = list(40, 0.0f, 0.01f);
  std::vector<HostTensor> p2 = p1, m2 = m1, v2 = v1;
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<HostTensor> g = list(60 + 20 * step, -1.0f, 1.0f);
    const ops::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f};
    std::vector<ops::AdamWTensor> ts;
    for (size_t k = 0; k < kCount; ++k) {
      const bool decay = k % 3 != 1;
      const int64_t n = kSizes[k];
      ts.push_back({view(p1[k], n), view(g[k], n), view(m1[k], n), view(v1[k], n), decay});
      ops::AdamWParams one = hp;
      one.weight_decay = decay ? hp.weight_decay : 0.0f;
      ops::adamw_update(view(p2[k], n), view(g[k], n), view(m2[k], n), view(v2[k], n), one);
    }
    ops::adamw_update(ts, hp);
    for (size_t k = 0; k < kCount; ++k) {
      EXPECT_TRUE(bits_equal(p1[k], p2[k])) << "param " << k << ", step " << step;
      EXPECT_TRUE(bits_equal(m1[k], m2[k])) << "m " << k << ", step " << step;
      EXPECT_TRUE(bits_equal(v1[k], v2[k])) << "v " << k << ", step " << step;
    }
  }
}

TEST_P(MultiTensor, SumSquaresListIsPerTensorSumsInOrder) {
  std::vector<HostTensor> xs = list(3, -3.0f, 3.0f);
  double per_tensor = 0.0, ref = 0.0;
  for (size_t k = 0; k < kCount; ++k) {
    per_tensor += ops::sum_squares(view(xs[k], kSizes[k]));
    for (int64_t i = 0; i < kSizes[k]; ++i) ref += static_cast<double>(xs[k][i]) * xs[k][i];
  }
  const std::vector<Tensor> vs = views(xs);
  EXPECT_EQ(ops::sum_squares(vs), per_tensor);  // bitwise
  EXPECT_NEAR(ops::sum_squares(vs), ref, 1e-12 * ref);
  EXPECT_EQ(ops::sum_squares(std::span<const Tensor>()), 0.0);
}

TEST_P(MultiTensor, HasNonfiniteListFindsEveryTensor) {
  std::vector<HostTensor> xs = list(5, -1e30f, 1e30f);
  EXPECT_FALSE(ops::has_nonfinite(views(xs)));
  EXPECT_FALSE(ops::has_nonfinite(std::span<const Tensor>()));
  for (size_t k = 0; k < kCount; ++k) {
    if (kSizes[k] == 0) continue;
    for (float bad :
         {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<HostTensor> ys = xs;
      ys[k][kSizes[k] - 1] = bad;
      EXPECT_TRUE(ops::has_nonfinite(views(ys))) << "tensor " << k << ": " << bad;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, MultiTensor, ::testing::Values(1, 3),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

}  // namespace
}  // namespace llmt::test
