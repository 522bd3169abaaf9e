// The synthetic source: a sample depends only on (seed, index), whatever batch it is read in, and
// the sequences are learnable (far below the uniform entropy).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "data/synthetic.h"

namespace llmt {
namespace {

TEST(Synthetic, SamplesDoNotDependOnBatching) {
  SyntheticSource src(3, 101);
  const int64_t W = 17;
  std::vector<int32_t> all(8 * W), part(3 * W);
  src.fill(all.data(), 10, 8, W);
  src.fill(part.data(), 13, 3, W);
  for (int64_t i = 0; i < 3 * W; ++i) EXPECT_EQ(part[i], all[3 * W + i]);
  SyntheticSource other(4, 101);
  std::vector<int32_t> o(8 * W);
  other.fill(o.data(), 10, 8, W);
  EXPECT_NE(o, all);
  for (int32_t t : all) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 101);
  }
}

TEST(Synthetic, BigramEntropyIsFarBelowUniform) {
  const int64_t V = 64, W = 257, S = 64;
  SyntheticSource src(1, V);
  std::vector<int32_t> tok(S * W);
  src.fill(tok.data(), 0, S, W);
  std::map<std::pair<int, int>, double> pair;
  std::map<int, double> first;
  double n = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t + 1 < W; ++t) {
      pair[{tok[s * W + t], tok[s * W + t + 1]}] += 1;
      first[tok[s * W + t]] += 1;
      n += 1;
    }
  double h = 0;  // conditional entropy H(next | current), nats
  for (auto& [k, c] : pair) h -= c / n * std::log(c / first[k.first]);
  EXPECT_LT(h, 0.6 * std::log(static_cast<double>(V))) << "H = " << h;
}

}  // namespace
}  // namespace llmt
