// Blending: over the first 10,000 samples every source's count stays within one sample of
// weight * n for every prefix n, each source is read in its own order, and any range of global
// samples gives the same assignment as the whole prefix.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "data/blend.h"

namespace llmt {
namespace {

// Source s of a blend: sample i is the window (s, i, 0, 0, ...).
class Tagged final : public SampleSource {
 public:
  explicit Tagged(int32_t tag) : tag_(tag) {}
  int64_t window() const override { return 4; }
  void fill(int32_t* out, int64_t first, int64_t n) const override {
    for (int64_t k = 0; k < n; ++k) {
      int32_t* row = out + k * 4;
      row[0] = tag_;
      row[1] = static_cast<int32_t>(first + k);
      row[2] = row[3] = 0;
    }
  }

 private:
  int32_t tag_;
};

Blend make_blend(const std::vector<double>& weights) {
  std::vector<std::shared_ptr<const SampleSource>> sources;
  for (size_t s = 0; s < weights.size(); ++s)
    sources.push_back(std::make_shared<Tagged>(static_cast<int32_t>(s)));
  return Blend(std::move(sources), weights);
}

struct Assignment {
  std::vector<int32_t> source;
  std::vector<int64_t> index;
};

Assignment assign(const Blend& b, int64_t first, int64_t n) {
  Assignment a{std::vector<int32_t>(static_cast<size_t>(n)),
               std::vector<int64_t>(static_cast<size_t>(n))};
  b.assign(first, n, a.source.data(), a.index.data());
  return a;
}

// max over n in [1, N] and sources s of |count_s(n) - w_s n|, and checks that each source's
// samples are its indices 0, 1, 2, ... in order.
double max_deviation(const Blend& b, int64_t N) {
  const Assignment a = assign(b, 0, N);
  const std::vector<double> w = b.weights();
  std::vector<int64_t> counts(w.size());
  double worst = 0;
  for (int64_t n = 1; n <= N; ++n) {
    const size_t s = static_cast<size_t>(a.source[static_cast<size_t>(n - 1)]);
    EXPECT_EQ(a.index[static_cast<size_t>(n - 1)], counts[s]) << "sample " << n - 1;
    ++counts[s];
    for (size_t k = 0; k < counts.size(); ++k)
      worst = std::max(worst,
                       std::fabs(static_cast<double>(counts[k]) - w[k] * static_cast<double>(n)));
  }
  return worst;
}

TEST(Blend, SharesWithinOneSampleOfTheirWeights) {
  const std::vector<std::vector<double>> cases = {
      {1, 1}, {0.5, 0.3, 0.2}, {0.7, 0.2, 0.05, 0.05}, {1, 2, 3, 4, 5}, {1000, 1}, {1}};
  for (const auto& w : cases) {
    const double dev = max_deviation(make_blend(w), 10'000);
    EXPECT_LE(dev, 1.0 + 1e-9) << "weights of case " << &w - cases.data();
  }
  // Random weights over 2..32 sources, skewed (cubes of uniforms).
  std::mt19937 gen(17);
  double worst = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int k = std::uniform_int_distribution<int>(2, 32)(gen);
    std::vector<double> w(static_cast<size_t>(k));
    for (double& x : w) x = std::pow(std::uniform_real_distribution<double>(0.01, 1)(gen), 3);
    worst = std::max(worst, max_deviation(make_blend(w), 10'000));
  }
  EXPECT_LE(worst, 1.0 + 1e-9);
}

TEST(Blend, ExactCounts) {
  const Blend b = make_blend({5, 3, 2});  // w = 0.5, 0.3, 0.2
  const Assignment a = assign(b, 0, 10'000);
  std::vector<int64_t> counts(3);
  for (int32_t s : a.source) ++counts[static_cast<size_t>(s)];
  EXPECT_EQ(counts, (std::vector<int64_t>{5000, 3000, 2000}));
  // The first ten by hand: the j-th sample of s is due at j / w_s (source 0 at 2, 4, 6, 8, 10;
  // 1 at 3.3, 6.7, 10; 2 at 5, 10); at n = 8 all three are released and due at 10: the tie
  // goes to source 0.
  EXPECT_EQ(std::vector<int32_t>(a.source.begin(), a.source.begin() + 10),
            (std::vector<int32_t>{0, 1, 0, 2, 0, 1, 0, 0, 1, 2}));
}

// Ranges starting anywhere (inside a checkpoint interval, on one, far ahead first) give the
// assignment of the whole prefix.
TEST(Blend, RangesMatchThePrefix) {
  const Blend whole = make_blend({0.6, 0.25, 0.1, 0.05});
  const Assignment ref = assign(whole, 0, 30'000);
  const Blend b = make_blend({0.6, 0.25, 0.1, 0.05});
  for (auto [first, n] : std::vector<std::pair<int64_t, int64_t>>{
           {25'000, 100}, {4090, 20}, {0, 5}, {kBlendCheckpoint, 1}, {12'345, 6000}}) {
    const Assignment a = assign(b, first, n);
    for (int64_t k = 0; k < n; ++k) {
      ASSERT_EQ(a.source[static_cast<size_t>(k)], ref.source[static_cast<size_t>(first + k)]);
      ASSERT_EQ(a.index[static_cast<size_t>(k)], ref.index[static_cast<size_t>(first + k)]);
    }
  }
}

TEST(Blend, FillReadsEachSourcesSample) {
  const Blend b = make_blend({2, 1});
  const Assignment a = assign(b, 100, 7);
  std::vector<int32_t> out(7 * 4);
  b.fill(out.data(), 100, 7);
  for (size_t k = 0; k < 7; ++k) {
    EXPECT_EQ(out[k * 4], a.source[k]);
    EXPECT_EQ(out[k * 4 + 1], a.index[k]);
  }
}

}  // namespace
}  // namespace llmt
