// Elementwise ops, fills, copies and dropout. Sizes straddle the threading threshold (n = 100003
// splits over threads, odd so chunks are uneven). Dropout is checked for its keep rate, its
// scaling, the identity of the forward and backward masks, and layout independence.
#include <cmath>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

class Elementwise : public ::testing::TestWithParam<int64_t> {};

TEST_P(Elementwise, AddAndAliases) {
  const int64_t n = GetParam();
  HostTensor a = uniform({n}, 1), b = uniform({n}, 2), b0 = b, out({n});
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = static_cast<double>(a[i]) + b[i];
  ops::add(out.t(), a.t(), b.t());
  EXPECT_TRUE(all_close(out, ref, {1e-7, 0}));
  ops::add(a.t(), a.t(), b.t());  // out aliases a
  EXPECT_TRUE(all_close(a, ref, {1e-7, 0}));
  ops::add_inplace(b.t(), out.t());  // b + (a + b)
  for (int64_t i = 0; i < n; ++i) ref[i] += b0[i];
  EXPECT_TRUE(all_close(b, ref, {1e-6, 1e-7}));
}

TEST_P(Elementwise, ScaleFillCopy) {
  const int64_t n = GetParam();
  HostTensor x = uniform({n}, 3), y({n});
  std::vector<double> ref = to_double(x);
  for (double& v : ref) v *= -0.37;
  ops::scale_inplace(x.t(), -0.37f);
  EXPECT_TRUE(all_close(x, ref, {1e-7, 0}));
  ops::copy(y.t(), x.t());
  EXPECT_TRUE(bits_equal(y, x));
  ops::fill(y.t(), 2.5f);
  EXPECT_TRUE(all_close(y, std::vector<double>(n, 2.5), {0, 0}));
  ops::fill_zero(y.t());
  EXPECT_TRUE(all_close(y, std::vector<double>(n, 0.0), {0, 0}));
}

TEST_P(Elementwise, CopyAndZeroAnyDtype) {
  const int64_t n = GetParam();
  HostTensor t = tokens({n}, 1000, 4), u({n}, DType::i32);
  ops::copy(u.t(), t.t());
  EXPECT_TRUE(bits_equal(u, t));
  ops::fill_zero(u.t());
  EXPECT_TRUE(bits_equal(u, HostTensor({n}, DType::i32)));
}

INSTANTIATE_TEST_SUITE_P(Sizes, Elementwise, ::testing::Values(1, 67, 100003), ParamName());

constexpr uint64_t kSeed = 42, kStream = 9;

TEST(Dropout, KeepRateScaleAndBackwardMask) {
  const int64_t n = 100003;
  const float p = 0.1f;
  HostTensor inp = uniform({n}, 1, 0.5f, 1.5f), out({n}), dinp({n});
  ops::dropout_forward(out.t(), inp.t(), p, kSeed, kStream, 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] == 0.0f) continue;
    ++kept;
    ASSERT_FLOAT_EQ(out[i], inp[i] / (1.0f - p)) << "at " << i;
  }
  // Binomial: std of the keep rate is sqrt(p(1-p)/n) ~ 0.001; allow 5 sigma.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 5 * std::sqrt(p * (1 - p) / n));
  // Backward recomputes the same mask: with dout = inp it reproduces the forward bit for bit.
  ops::dropout_backward(dinp.t(), inp.t(), p, kSeed, kStream, 0);
  EXPECT_TRUE(bits_equal(dinp, out));
}

TEST(Dropout, MaskIsTheCounterRngAndLayoutIndependent) {
  const int64_t n = 1000, half = 373;
  const float p = 0.25f;
  HostTensor inp = uniform({n}, 2, 1.0f, 2.0f), whole({n}), parts({n});
  ops::dropout_forward(whole.t(), inp.t(), p, kSeed, kStream, 0);
  for (int64_t i = 0; i < n; ++i) {
    bool keep = rng::uniform(rng::key(kSeed, kStream, i)) >= p;
    ASSERT_EQ(whole[i] != 0.0f, keep) << "at " << i;
  }
  Tensor in_t = inp.t(), parts_t = parts.t();
  ops::dropout_forward(parts_t.rows(0, half), in_t.rows(0, half), p, kSeed, kStream, 0);
  ops::dropout_forward(parts_t.rows(half, n), in_t.rows(half, n), p, kSeed, kStream, half);
  EXPECT_TRUE(bits_equal(parts, whole));
}

TEST(Dropout, ZeroProbabilityIsIdentity) {
  HostTensor inp = uniform({257}, 3), out({257});
  ops::dropout_forward(out.t(), inp.t(), 0.0f, kSeed, kStream, 0);
  EXPECT_TRUE(bits_equal(out, inp));
}

TEST(Dropout, GradientMatchesFiniteDifferences) {
  HostTensor inp = uniform({3, 67}, 4), out({3, 67}), w = uniform({3, 67}, 5), dinp({3, 67});
  ops::dropout_backward(dinp.t(), w.t(), 0.3f, kSeed, kStream, 11);
  auto loss = [&] {
    ops::dropout_forward(out.t(), inp.t(), 0.3f, kSeed, kStream, 11);
    return weighted_sum(out, w);
  };
  EXPECT_TRUE(check_gradient(loss, inp, dinp));
}

TEST(AddBias, AddsToEveryRow) {
  HostTensor x = uniform({5, 3, 17}, 1), bias = uniform({17}, 2);
  std::vector<double> want = to_double(x);
  for (int64_t i = 0; i < x.numel(); ++i) want[i] = static_cast<float>(x[i] + bias[i % 17]);
  ops::add_bias(x.t(), bias.t());
  EXPECT_TRUE(all_close(x, want, {0, 0}));
  HostTensor wrong({16});
  EXPECT_THROW(ops::add_bias(x.t(), wrong.t()), Error);
}

// copy_blocks against index loops: strided blocks, one block into every head, a sum over heads
// (in block order), the elements between blocks untouched; overlapping writes refused.
TEST(CopyBlocks, MovesTheBlocksItIsGiven) {
  const int64_t rows = 301;  // over the threading threshold at these widths
  HostTensor src = uniform({rows, 40}, 1), dst = uniform({rows, 33}, 2), d0 = dst;
  ops::copy_blocks(dst.t(), src.t(), {4, 5, 3, 8, 1, 9});
  std::vector<double> want = to_double(d0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t i = 0; i < 5; ++i) want[r * 33 + 3 + j * 8 + i] = src[r * 40 + 1 + j * 9 + i];
  EXPECT_TRUE(all_close(dst, want, {0, 0}));

  HostTensor bc = uniform({rows, 33}, 3), b0 = bc;
  ops::copy_blocks(bc.t(), src.t(), {3, 6, 2, 10, 30, 0});
  want = to_double(b0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t i = 0; i < 6; ++i) want[r * 33 + 2 + j * 10 + i] = src[r * 40 + 30 + i];
  EXPECT_TRUE(all_close(bc, want, {0, 0}));

  HostTensor sum = uniform({rows, 4}, 4), s0 = sum;
  ops::copy_blocks(sum.t(), src.t(), {5, 4, 0, 0, 2, 7}, /*add=*/true);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < 4; ++i) {
      float acc = s0[r * 4 + i];
      for (int64_t j = 0; j < 5; ++j) acc += src[r * 40 + 2 + j * 7 + i];
      ASSERT_EQ(sum[r * 4 + i], acc) << "row " << r << " element " << i;
    }

  EXPECT_THROW(ops::copy_blocks(dst.t(), src.t(), {2, 5, 0, 0, 0, 5}), Error);   // overlap
  EXPECT_THROW(ops::copy_blocks(dst.t(), src.t(), {4, 5, 20, 4, 0, 5}), Error);  // past dst
  HostTensor other({rows + 1, 33});
  EXPECT_THROW(ops::copy_blocks(other.t(), src.t(), {1, 5, 0, 0, 0, 0}), Error);  // rows
}

}  // namespace
}  // namespace llmt::test
