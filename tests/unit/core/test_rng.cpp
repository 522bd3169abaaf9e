// The counter-based generator: pure functions of their keys, sane distributions.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

namespace llmt {
namespace {

TEST(Rng, KeysAreDeterministicAndSpread) {
  EXPECT_EQ(rng::key(1, 2, 3), rng::key(1, 2, 3));
  EXPECT_NE(rng::key(1, 2, 3), rng::key(1, 2, 4));
  EXPECT_NE(rng::key(1, 2, 3), rng::key(2, 2, 3));
  EXPECT_NE(rng::hash_name("layers.0.attn.qkv.weight"), rng::hash_name("layers.1.attn.qkv.weight"));
}

TEST(Rng, UniformAndNormalMoments) {
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    float u = rng::uniform(rng::key(7, 11, i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    float z = rng::normal(rng::key(7, 13, i));
    ASSERT_TRUE(std::isfinite(z));
    sn += z;
    sn2 += static_cast<double>(z) * z;
  }
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.015);
}

}  // namespace
}  // namespace llmt
