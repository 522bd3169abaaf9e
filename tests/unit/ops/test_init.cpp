// init_normal: exactly the counter-based generator's values, the same bits whether a tensor is
// initialised whole or in slices with their global offsets, and N(0, std) statistics; fill.
#include <cmath>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

constexpr uint64_t kSeed = 1234, kStream = rng::hash_name("layers.0.attn.qkv.weight");

TEST(InitNormal, ValuesComeFromTheCounterRng) {
  HostTensor x({3, 67});
  ops::init_normal(x.t(), 0.02f, kSeed, kStream, 500);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(x[i], 0.02f * rng::normal(rng::key(kSeed, kStream, 500 + i))) << i;
}

TEST(InitNormal, SlicesWithGlobalOffsetsEqualTheWholeTensor) {
  const int64_t rows = 1001, cols = 67, split = 389;
  HostTensor whole({rows, cols}), parts({rows, cols});
  ops::init_normal(whole.t(), 0.02f, kSeed, kStream);
  Tensor p = parts.t();
  ops::init_normal(p.rows(0, split), 0.02f, kSeed, kStream, 0);
  ops::init_normal(p.rows(split, rows), 0.02f, kSeed, kStream, split * cols);
  EXPECT_TRUE(bits_equal(parts, whole));
}

TEST(InitNormal, MeanAndStd) {
  const int64_t n = 100000;
  const double std = 0.02;
  HostTensor x({n});
  ops::init_normal(x.t(), static_cast<float>(std), kSeed, kStream);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i], sq += static_cast<double>(x[i]) * x[i];
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 5 * std / std::sqrt(n));  // 5 sigma of the sample mean
  EXPECT_NEAR(sd, std, 0.02 * std);                // sample std is within ~0.3% (1 sigma)
}

TEST(InitNormal, StreamsDiffer) {
  HostTensor a({64}), b({64});
  ops::init_normal(a.t(), 1.0f, kSeed, kStream);
  ops::init_normal(b.t(), 1.0f, kSeed, rng::hash_name("layers.0.attn.proj.weight"));
  EXPECT_FALSE(bits_equal(a, b));
}

TEST(Fill, SetsEveryElement) {
  HostTensor x = uniform({100003}, 1);
  ops::fill(x.t(), 1.0f);
  EXPECT_TRUE(all_close(x, std::vector<double>(100003, 1.0), {0, 0}));
}

// A column shard (every row's columns [c0, c0+W) of a (R, Cg) tensor) initialised on its own
// equals that slice of the whole tensor, bit for bit: what a row-parallel weight's tp shard does.
TEST(InitNormal, ColumnShardEqualsSliceOfWhole) {
  const int64_t R = 7, Cg = 24, W = 6, c0 = 12;
  HostTensor whole({R, Cg}), shard({R, W});
  ops::init_normal(whole.t(), 0.02f, kSeed, kStream);
  ops::init_normal(shard.t(), 0.02f, kSeed, kStream, c0, Cg);
  HostTensor want({R, W});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < W; ++w) want[r * W + w] = whole[r * Cg + c0 + w];
  EXPECT_TRUE(bits_equal(shard, want));
  EXPECT_THROW(ops::init_normal(whole.t(), 0.02f, kSeed, kStream, 0, W), Error);  // wider
}

}  // namespace
}  // namespace llmt::test
