// Fused softmax cross-entropy against a double-precision softmax: losses, gradients (separate and
// in place over the logits), ignored targets, loss-only calls, large logits, a GPT-2 sized
// vocabulary, and finite differences of the gradient.
#include <algorithm>
#include <cmath>
#include <ostream>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

struct LossCase {
  int64_t N, V;
};

std::ostream& operator<<(std::ostream& os, const LossCase& c) {
  return os << "N" << c.N << "_V" << c.V;
}

struct LossRef {
  std::vector<double> losses, dlogits;
};

LossRef reference(const HostTensor& logits, const HostTensor& targets, int64_t N, int64_t V,
                  double dloss) {
  LossRef r{std::vector<double>(N, 0.0), std::vector<double>(N * V, 0.0)};
  for (int64_t n = 0; n < N; ++n) {
    const int32_t target = targets.i32()[n];
    if (target < 0) continue;
    const float* x = logits.f32() + n * V;
    const double m = *std::max_element(x, x + V);
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += std::exp(x[i] - m);
    const double lse = m + std::log(s);
    r.losses[n] = lse - x[target];
    for (int64_t i = 0; i < V; ++i)
      r.dlogits[n * V + i] = (std::exp(x[i] - lse) - (i == target ? 1.0 : 0.0)) * dloss;
  }
  return r;
}

// Targets with every third row ignored (-1).
HostTensor targets_with_ignored(int64_t N, int64_t V) {
  HostTensor t = tokens({N}, static_cast<int32_t>(V), 2);
  for (int64_t n = 1; n < N; n += 3) t.i32()[n] = -1;
  return t;
}

class Loss : public ::testing::TestWithParam<LossCase> {};

TEST_P(Loss, MatchesReferenceSeparateAndInPlace) {
  const auto [N, V] = GetParam();
  const float dloss = 1.0f / static_cast<float>(N);
  HostTensor logits = normal({N, V}, 1, 3.0f), targets = targets_with_ignored(N, V);
  HostTensor losses({N}), dlogits = uniform({N, V}, 3);  // fully overwritten
  LossRef ref = reference(logits, targets, N, V, dloss);
  ops::softmax_cross_entropy(losses.t(), dlogits.t(), logits.t(), targets.t(), dloss);
  EXPECT_TRUE(all_close(losses, ref.losses, {1e-5, 1e-5}));
  EXPECT_TRUE(all_close(dlogits, ref.dlogits, {1e-5, 1e-8}));
  for (int64_t n = 1; n < N; n += 3) EXPECT_EQ(losses[n], 0.0f) << "ignored row " << n;

  HostTensor only({N});
  ops::softmax_cross_entropy(only.t(), Tensor(), logits.t(), targets.t(), dloss);
  EXPECT_TRUE(bits_equal(only, losses));

  ops::softmax_cross_entropy(only.t(), logits.t(), logits.t(), targets.t(), dloss);  // in place
  EXPECT_TRUE(bits_equal(only, losses));
  EXPECT_TRUE(bits_equal(logits, dlogits));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Loss,
                         ::testing::Values(LossCase{1, 2}, LossCase{3, 101}, LossCase{8, 1000},
                                           LossCase{4, 50257}),
                         ParamName());

TEST(LossOps, GradientMatchesFiniteDifferences) {
  const int64_t N = 3, V = 101;
  const float dloss = 1.0f;
  HostTensor logits = normal({N, V}, 4, 2.0f), targets = tokens({N}, V, 5), losses({N});
  HostTensor dlogits({N, V});
  ops::softmax_cross_entropy(losses.t(), dlogits.t(), logits.t(), targets.t(), dloss);
  auto loss = [&] {
    ops::softmax_cross_entropy(losses.t(), Tensor(), logits.t(), targets.t(), dloss);
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += dloss * losses[n];
    return s;
  };
  // Probabilities ~1/V: the f32 loss (~5) limits the numeric derivative to ~1e-4 absolute.
  EXPECT_TRUE(check_gradient(loss, logits, dlogits, {.atol = 3e-4, .max_probes = N * V}));
}

TEST(LossOps, LargeLogitsAreStable) {
  const int64_t N = 2, V = 300;
  HostTensor logits = normal({N, V}, 6), shifted = logits, targets = tokens({N}, V, 7);
  for (int64_t i = 0; i < N * V; ++i) shifted[i] += 1000.0f;
  HostTensor a({N}), b({N});
  ops::softmax_cross_entropy(a.t(), Tensor(), logits.t(), targets.t(), 1.0f);
  ops::softmax_cross_entropy(b.t(), Tensor(), shifted.t(), targets.t(), 1.0f);
  // Shifting by 1000 rounds the logits to multiples of 2^-14: compare loosely.
  EXPECT_TRUE(all_close(b, to_double(a), {1e-3, 1e-3}));
}

TEST(LossOps, RejectsTargetOutsideVocabulary) {
  HostTensor logits = normal({2, 5}, 8), targets = tokens({2}, 5, 9), losses({2});
  targets.i32()[1] = 5;
  EXPECT_THROW(ops::softmax_cross_entropy(losses.t(), Tensor(), logits.t(), targets.t(), 1.0f),
               Error);
}

// Vocab-parallel cross-entropy: the shard ops, with max and sums reduced over the shards as the
// tp all-reduces would, give the fused loss and, shard by shard, its gradient.
class LossShards : public ::testing::TestWithParam<int64_t> {};

TEST_P(LossShards, MatchFusedLossAndGradient) {
  const int64_t shards = GetParam(), N = 13, V = 96, Vl = V / shards;
  const float dloss = 0.25f;
  HostTensor logits = normal({N, V}, 1, 3.0f), targets = targets_with_ignored(N, V);
  HostTensor losses({N}), dlogits({N, V});
  ops::softmax_cross_entropy(losses.t(), dlogits.t(), logits.t(), targets.t(), dloss);
  std::vector<HostTensor> parts;
  for (int64_t r = 0; r < shards; ++r) {
    HostTensor p({N, Vl});
    for (int64_t n = 0; n < N; ++n)
      std::copy(logits.f32() + n * V + r * Vl, logits.f32() + n * V + (r + 1) * Vl,
                p.f32() + n * Vl);
    parts.push_back(p);
  }
  HostTensor max = constant({N}, -INFINITY), sums({2, N});
  for (int64_t r = 0; r < shards; ++r) {  // all-reduce(max)
    HostTensor m({N});
    ops::cross_entropy_shard_max(m.t(), parts[r].t(), targets.t(), V);
    for (int64_t n = 0; n < N; ++n) max[n] = std::max(max[n], m[n]);
  }
  for (int64_t r = 0; r < shards; ++r) {  // all-reduce(sum)
    HostTensor s({2, N});
    ops::cross_entropy_shard_sums(s.t(), parts[r].t(), max.t(), targets.t(), r * Vl);
    for (int64_t i = 0; i < 2 * N; ++i) sums[i] += s[i];
  }
  for (int64_t r = 0; r < shards; ++r) {
    HostTensor l({N});
    ops::cross_entropy_shard_finish(l.t(), parts[r].t(), parts[r].t(), max.t(), sums.t(),
                                    targets.t(), r * Vl, dloss);  // in place
    EXPECT_TRUE(all_close(l, losses, {1e-5, 1e-6})) << "shard " << r;
    std::vector<double> want;
    for (int64_t n = 0; n < N; ++n)
      want.insert(want.end(), dlogits.f32() + n * V + r * Vl, dlogits.f32() + n * V + (r + 1) * Vl);
    EXPECT_TRUE(all_close(parts[r], want, {1e-5, 1e-8})) << "shard " << r;
  }
  targets.i32()[0] = static_cast<int32_t>(V);
  HostTensor m({N});
  EXPECT_THROW(ops::cross_entropy_shard_max(m.t(), parts[0].t(), targets.t(), V), Error);
}

INSTANTIATE_TEST_SUITE_P(Shards, LossShards, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace llmt::test
