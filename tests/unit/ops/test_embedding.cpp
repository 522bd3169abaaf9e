// embedding_forward/backward against a double-precision gather/scatter, with and without learned
// positions, over shapes where token ids collide (V small) and where they do not.
#include <ostream>

#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

struct EmbeddingCase {
  int64_t B, T, C, V, P;  // P = 0: no position table
  int64_t pos_offset;
};

std::ostream& operator<<(std::ostream& os, const EmbeddingCase& c) {
  return os << "B" << c.B << "_T" << c.T << "_C" << c.C << "_V" << c.V << "_P" << c.P << "_off"
            << c.pos_offset;
}

class Embedding : public ::testing::TestWithParam<EmbeddingCase> {
 protected:
  void SetUp() override {
    const auto& c = GetParam();
    tok = tokens({c.B, c.T}, static_cast<int32_t>(c.V), 1);
    wte = uniform({c.V, c.C}, 2);
    if (c.P) wpe = uniform({c.P, c.C}, 3);
    out = HostTensor({c.B, c.T, c.C});
  }
  void forward() {
    ops::embedding_forward(out.t(), tok.t(), wte.t(), wpe.t(), GetParam().pos_offset);
  }

  HostTensor tok, wte, wpe, out;
};

TEST_P(Embedding, ForwardMatchesGather) {
  const auto& c = GetParam();
  forward();
  std::vector<double> ref(out.numel());
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t ch = 0; ch < c.C; ++ch) {
        double v = wte[tok.i32()[b * c.T + t] * c.C + ch];
        if (c.P) v += wpe[(c.pos_offset + t) * c.C + ch];
        ref[(b * c.T + t) * c.C + ch] = v;
      }
  EXPECT_TRUE(all_close(out, ref, {0, 0}));
}

TEST_P(Embedding, BackwardAddsScatteredRows) {
  const auto& c = GetParam();
  HostTensor dout = uniform({c.B, c.T, c.C}, 4);
  HostTensor dwte = uniform({c.V, c.C}, 5), dwpe;  // nonzero: backward must add into them
  if (c.P) dwpe = uniform({c.P, c.C}, 6);
  std::vector<double> ref_wte = to_double(dwte), ref_wpe;
  if (c.P) ref_wpe = to_double(dwpe);
  for (int64_t n = 0; n < c.B * c.T; ++n)
    for (int64_t ch = 0; ch < c.C; ++ch) {
      ref_wte[tok.i32()[n] * c.C + ch] += dout[n * c.C + ch];
      if (c.P) ref_wpe[(c.pos_offset + n % c.T) * c.C + ch] += dout[n * c.C + ch];
    }
  ops::embedding_backward(dwte.t(), dwpe.t(), dout.t(), tok.t(), c.pos_offset);
  EXPECT_TRUE(all_close(dwte, ref_wte, {1e-6, 1e-6}));
  if (c.P) {
    EXPECT_TRUE(all_close(dwpe, ref_wpe, {1e-6, 1e-6}));
  }
}

TEST_P(Embedding, GradientsMatchFiniteDifferences) {
  const auto& c = GetParam();
  HostTensor w = uniform({c.B, c.T, c.C}, 7);
  HostTensor dwte({c.V, c.C}), dwpe;
  if (c.P) dwpe = HostTensor({c.P, c.C});
  ops::embedding_backward(dwte.t(), dwpe.t(), w.t(), tok.t(), c.pos_offset);
  auto loss = [&] {
    forward();
    return weighted_sum(out, w);
  };
  EXPECT_TRUE(check_gradient(loss, wte, dwte));
  if (c.P) {
    EXPECT_TRUE(check_gradient(loss, wpe, dwpe));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Embedding,
                         ::testing::Values(EmbeddingCase{1, 1, 3, 5, 0, 0},
                                           EmbeddingCase{1, 1, 3, 5, 4, 3},
                                           EmbeddingCase{2, 5, 67, 101, 5, 0},
                                           EmbeddingCase{3, 7, 16, 11, 20, 13},
                                           EmbeddingCase{4, 64, 130, 1000, 64, 0}),
                         ParamName());

TEST(EmbeddingOps, BackwardAccumulatesOverCalls) {
  HostTensor tok = tokens({2, 9}, 7, 1), dout = uniform({2, 9, 33}, 2);
  HostTensor once({7, 33}), twice({7, 33}), pos_once({9, 33}), pos_twice({9, 33});
  ops::embedding_backward(once.t(), pos_once.t(), dout.t(), tok.t());
  for (int i = 0; i < 2; ++i) ops::embedding_backward(twice.t(), pos_twice.t(), dout.t(), tok.t());
  std::vector<double> ref = to_double(once), pos_ref = to_double(pos_once);
  for (double& x : ref) x *= 2;
  for (double& x : pos_ref) x *= 2;
  EXPECT_TRUE(all_close(twice, ref, {1e-6, 1e-7}));
  EXPECT_TRUE(all_close(pos_twice, pos_ref, {1e-6, 1e-7}));
}

TEST(EmbeddingOps, RejectsTokenOutsideVocabulary) {
  HostTensor tok = tokens({1, 4}, 5, 1), wte = uniform({5, 8}, 2), out({1, 4, 8});
  tok.i32()[2] = 5;
  EXPECT_THROW(ops::embedding_forward(out.t(), tok.t(), wte.t(), Tensor()), Error);
  tok.i32()[2] = -1;
  EXPECT_THROW(ops::embedding_backward(wte.t(), Tensor(), out.t(), tok.t()), Error);
}

// Vocab-parallel: shards of wte, each looking up only its rows, sum to the whole lookup exactly
// (one shard contributes each row, the others exact zeros; wpe is added by one shard only), and
// their backward fills each shard's slice of the whole dwte while every shard gets all of dwpe.
TEST(EmbeddingOps, VocabShardsSumToWholeLookup) {
  const int64_t B = 2, T = 9, C = 20, V = 12, shards = 4, Vl = V / shards;
  HostTensor tok = tokens({B, T}, static_cast<int32_t>(V), 1), wte = uniform({V, C}, 2);
  HostTensor wpe = uniform({T, C}, 3), dout = uniform({B, T, C}, 4);
  HostTensor whole({B, T, C}), dwte({V, C}), dwpe({T, C});
  ops::embedding_forward(whole.t(), tok.t(), wte.t(), wpe.t());
  ops::embedding_backward(dwte.t(), dwpe.t(), dout.t(), tok.t());
  std::vector<double> sum(whole.numel(), 0.0);
  for (int64_t r = 0; r < shards; ++r) {
    HostTensor shard({Vl, C}), part({B, T, C}), dshard({Vl, C}), dpos({T, C});
    std::copy(wte.f32() + r * Vl * C, wte.f32() + (r + 1) * Vl * C, shard.f32());
    ops::embedding_forward(part.t(), tok.t(), shard.t(), r == 0 ? wpe.t() : Tensor(), 0, r * Vl, V);
    for (int64_t i = 0; i < part.numel(); ++i) sum[i] += part[i];
    ops::embedding_backward(dshard.t(), dpos.t(), dout.t(), tok.t(), 0, r * Vl, V);
    std::vector<double> want(dwte.f32() + r * Vl * C, dwte.f32() + (r + 1) * Vl * C);
    EXPECT_TRUE(all_close(dshard, want, {0, 0})) << "shard " << r;
    EXPECT_TRUE(bits_equal(dpos, dwpe)) << "shard " << r;
  }
  EXPECT_TRUE(all_close(whole, sum, {0, 0}));
  HostTensor shard({Vl, C}), part({B, T, C});
  tok.i32()[3] = static_cast<int32_t>(V);  // outside the whole vocabulary, not just the shard
  EXPECT_THROW(ops::embedding_forward(part.t(), tok.t(), shard.t(), Tensor(), 0, 0, V), Error);
  EXPECT_THROW(ops::embedding_forward(part.t(), tok.t(), shard.t(), Tensor(), 0, V - 1, V), Error);
}

}  // namespace
}  // namespace llmt::test
