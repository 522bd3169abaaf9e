// The attention blocks of context parallelism (ops.h attention_block_*, attention_merge,
// copy_heads) on one process: the cp ranks' zigzag shares of a sequence, each attended block by
// block against every rank's K/V and merged by log-sum-exp as the ring does, give the whole
// sequence's attention_forward/backward at those positions; positions 0..T-1 give its exact bits;
// a block no query sees leaves the merge unchanged; RoPE and the embedding at explicit positions
// equal their pos_offset form.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/parallel/context_parallel.h"
#include "kernels/ops.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {
namespace {

struct CpCase {
  int64_t B, T, H, KV, D;
  int cp;
};

std::ostream& operator<<(std::ostream& os, const CpCase& c) {
  return os << "B" << c.B << "_T" << c.T << "_H" << c.H << "_KV" << c.KV << "_D" << c.D << "_cp"
            << c.cp;
}

HostTensor positions_of(const std::vector<int32_t>& p) {
  HostTensor t({static_cast<int64_t>(p.size())}, DType::i32);
  std::copy(p.begin(), p.end(), t.i32());
  return t;
}

// Rows `pos` of x (B,T,W,D) -> (B,len(pos),W,D), and the scatter back.
HostTensor gather_rows(const HostTensor& x, const std::vector<int32_t>& pos) {
  const int64_t B = x.shape()[0], T = x.shape()[1], row = x.numel() / (B * T);
  const int64_t n = static_cast<int64_t>(pos.size());
  HostTensor out({B, n, x.shape()[2], x.shape()[3]});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(x.f32() + (b * T + pos[t]) * row, row, out.f32() + (b * n + t) * row);
  return out;
}
void scatter_rows(HostTensor& x, const HostTensor& part, const std::vector<int32_t>& pos) {
  const int64_t B = x.shape()[0], T = x.shape()[1], row = x.numel() / (B * T);
  const int64_t n = static_cast<int64_t>(pos.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(part.f32() + (b * n + t) * row, row, x.f32() + (b * T + pos[t]) * row);
}
// lse (B,H,T) at positions -> (B,H,n), and back.
HostTensor gather_lse(const HostTensor& l, const std::vector<int32_t>& pos) {
  const int64_t B = l.shape()[0], H = l.shape()[1], T = l.shape()[2];
  const int64_t n = static_cast<int64_t>(pos.size());
  HostTensor out({B, H, n});
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < n; ++t) out[bh * n + t] = l[bh * T + pos[t]];
  return out;
}

class CpBlocks : public ::testing::TestWithParam<CpCase> {};

// The ring's arithmetic on one process: rank r's queries against every rank's K/V, merged; then
// the backward block by block, each rank's dK/dV summed over the ranks that saw them.
TEST_P(CpBlocks, RingOfBlocksIsTheWholeSequence) {
  const CpCase c = GetParam();
  const int64_t W = c.H + 2 * c.KV;
  HostTensor qkv = normal({c.B, c.T, W, c.D}, 1, 1.5f);
  HostTensor dout = uniform({c.B, c.T, c.H, c.D}, 2);
  HostTensor out({c.B, c.T, c.H, c.D}), lse({c.B, c.H, c.T}), dqkv({c.B, c.T, W, c.D});
  ops::attention_forward(out.t(), lse.t(), qkv.t(), c.H, c.KV);
  ops::attention_backward(dqkv.t(), dout.t(), qkv.t(), out.t(), lse.t(), c.H, c.KV);

  std::vector<std::vector<int32_t>> pos;
  std::vector<HostTensor> local, kv;
  for (int r = 0; r < c.cp; ++r) {
    pos.push_back(zigzag_shard(c.T, c.cp, r).positions());
    local.push_back(gather_rows(qkv, pos[r]));
    const int64_t Tl = static_cast<int64_t>(pos[r].size());
    kv.emplace_back(Shape({c.B, Tl, 2 * c.KV, c.D}));
    ops::copy_heads(kv[r].t(), 0, local[r].t(), c.H, 2 * c.KV);
  }
  const int64_t Tl = static_cast<int64_t>(pos[0].size());
  HostTensor got_out({c.B, c.T, c.H, c.D}), got_dqkv({c.B, c.T, W, c.D});
  std::vector<HostTensor> dkv;
  for (int r = 0; r < c.cp; ++r) dkv.emplace_back(Shape({c.B, Tl, 2 * c.KV, c.D}));
  for (int r = 0; r < c.cp; ++r) {
    HostTensor o({c.B, Tl, c.H, c.D}), l({c.B, c.H, Tl});
    HostTensor po({c.B, Tl, c.H, c.D}), pl({c.B, c.H, Tl});
    HostTensor qp = positions_of(pos[r]);
    for (int i = 0; i < c.cp; ++i) {
      const int src = (r - i + c.cp) % c.cp;
      HostTensor kp = positions_of(pos[src]);
      if (i == 0) {
        ops::attention_block_forward(o.t(), l.t(), local[r].t(), kv[src].t(), 0, qp.t(), kp.t(),
                                     c.H, c.KV);
      } else {
        ops::attention_block_forward(po.t(), pl.t(), local[r].t(), kv[src].t(), 0, qp.t(), kp.t(),
                                     c.H, c.KV);
        ops::attention_merge(o.t(), l.t(), po.t(), pl.t());
      }
    }
    EXPECT_TRUE(all_close(l, to_double(gather_lse(lse, pos[r])), Tol{1e-5, 1e-5})) << "rank " << r;
    scatter_rows(got_out, o, pos[r]);
    // Backward with this rank's final output and lse.
    HostTensor dl = gather_rows(dout, pos[r]);
    HostTensor dloc({c.B, Tl, W, c.D});
    for (int i = 0; i < c.cp; ++i) {
      const int src = (r - i + c.cp) % c.cp;
      HostTensor kp = positions_of(pos[src]);
      ops::attention_block_backward(dloc.t(), dkv[src].t(), dl.t(), local[r].t(), kv[src].t(), 0,
                                    o.t(), l.t(), qp.t(), kp.t(), c.H, c.KV);
    }
    scatter_rows(got_dqkv, dloc, pos[r]);  // q heads; the kv heads follow below
  }
  for (int r = 0; r < c.cp; ++r) {
    HostTensor dloc = gather_rows(got_dqkv, pos[r]);
    ops::copy_heads(dloc.t(), c.H, dkv[r].t(), 0, 2 * c.KV);
    scatter_rows(got_dqkv, dloc, pos[r]);
  }
  EXPECT_TRUE(all_close(got_out, to_double(out), Tol{1e-5, 1e-6}));
  EXPECT_TRUE(all_close(got_dqkv, to_double(dqkv), Tol{1e-5, 1e-5}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpBlocks,
                         ::testing::Values(CpCase{2, 32, 4, 2, 16, 2},    // GQA, chunks of 8
                                           CpCase{1, 256, 2, 1, 64, 2},   // chunks of a tile
                                           CpCase{1, 260, 4, 4, 24, 2},   // chunks of 65: tiles
                                                                          // straddle chunks
                                           CpCase{2, 48, 6, 3, 8, 3},     // cp 3
                                           CpCase{1, 400, 4, 2, 32, 4}),  // cp 4, chunks of 50
                         ParamName());

// Positions 0..T-1 are plain causal attention: the same bits as attention_forward/backward.
TEST(CpBlocks, PositionsZeroToTIsTheFusedCall) {
  const int64_t B = 2, T = 130, H = 4, KV = 2, D = 16, W = H + 2 * KV;
  HostTensor qkv = normal({B, T, W, D}, 3, 1.5f), dout = uniform({B, T, H, D}, 4);
  HostTensor out({B, T, H, D}), lse({B, H, T}), dqkv({B, T, W, D});
  ops::attention_forward(out.t(), lse.t(), qkv.t(), H, KV);
  ops::attention_backward(dqkv.t(), dout.t(), qkv.t(), out.t(), lse.t(), H, KV);
  std::vector<int32_t> iota(T);
  for (int64_t t = 0; t < T; ++t) iota[t] = static_cast<int32_t>(t);
  HostTensor p = positions_of(iota);
  HostTensor o({B, T, H, D}), l({B, H, T}), d({B, T, W, D});
  ops::attention_block_forward(o.t(), l.t(), qkv.t(), qkv.t(), H, p.t(), p.t(), H, KV);
  ops::attention_block_backward(d.t(), d.t(), dout.t(), qkv.t(), qkv.t(), H, o.t(), l.t(), p.t(),
                                p.t(), H, KV);
  EXPECT_TRUE(bits_equal(o, out));
  EXPECT_TRUE(bits_equal(l, lse));
  EXPECT_TRUE(bits_equal(d, dqkv));
}

// Keys all after the queries: nothing visible, out 0 and lse -inf, and merging that block changes
// no bit of a running result; its backward adds nothing.
TEST(CpBlocks, InvisibleBlockAddsNothing) {
  const int64_t B = 1, Tq = 8, Tk = 8, H = 2, KV = 1, D = 8;
  HostTensor q = normal({B, Tq, H + 2 * KV, D}, 5), kv = normal({B, Tk, 2 * KV, D}, 6);
  std::vector<int32_t> qp(Tq), kp(Tk);
  for (int64_t t = 0; t < Tq; ++t) qp[t] = static_cast<int32_t>(t), kp[t] = static_cast<int32_t>(100 + t);
  HostTensor qpt = positions_of(qp), kpt = positions_of(kp);
  HostTensor o({B, Tq, H, D}), l({B, H, Tq});
  ops::attention_block_forward(o.t(), l.t(), q.t(), kv.t(), 0, qpt.t(), kpt.t(), H, KV);
  for (int64_t i = 0; i < o.numel(); ++i) EXPECT_EQ(o[i], 0.0f);
  for (int64_t i = 0; i < l.numel(); ++i) EXPECT_EQ(l[i], -std::numeric_limits<float>::infinity());
  HostTensor run = normal({B, Tq, H, D}, 7), run_lse = normal({B, H, Tq}, 8);
  HostTensor before = run, before_lse = run_lse;
  ops::attention_merge(run.t(), run_lse.t(), o.t(), l.t());
  EXPECT_TRUE(bits_equal(run, before));
  EXPECT_TRUE(bits_equal(run_lse, before_lse));
  HostTensor dq({B, Tq, H + 2 * KV, D}), dkv({B, Tk, 2 * KV, D});
  ops::attention_block_backward(dq.t(), dkv.t(), uniform({B, Tq, H, D}, 9).t(), q.t(), kv.t(), 0,
                                run.t(), run_lse.t(), qpt.t(), kpt.t(), H, KV);
  for (int64_t i = 0; i < dq.numel(); ++i) EXPECT_EQ(dq[i], 0.0f);
  for (int64_t i = 0; i < dkv.numel(); ++i) EXPECT_EQ(dkv[i], 0.0f);
}

// Merging two halves of a key set gives the softmax over all of it (against one block of both).
TEST(CpBlocks, MergeOfTwoKeySetsIsTheirUnion) {
  const int64_t B = 2, T = 24, H = 2, KV = 2, D = 8, W = H + 2 * KV;
  HostTensor qkv = normal({B, T, W, D}, 10, 1.5f);
  std::vector<int32_t> all(T);
  for (int64_t t = 0; t < T; ++t) all[t] = static_cast<int32_t>(t + 1000);  // every key visible
  HostTensor q_pos = positions_of(all);
  std::vector<int32_t> pos_lo(T / 2), pos_hi(T / 2), rows_lo(T / 2), rows_hi(T / 2);
  for (int64_t t = 0; t < T / 2; ++t) {
    pos_lo[t] = static_cast<int32_t>(t), rows_lo[t] = static_cast<int32_t>(t);
    pos_hi[t] = static_cast<int32_t>(T / 2 + t), rows_hi[t] = static_cast<int32_t>(T / 2 + t);
  }
  std::vector<int32_t> every(T);
  for (int64_t t = 0; t < T; ++t) every[t] = static_cast<int32_t>(t);
  HostTensor kv_all({B, T, 2 * KV, D});
  ops::copy_heads(kv_all.t(), 0, qkv.t(), H, 2 * KV);
  HostTensor kv_lo = gather_rows(kv_all, rows_lo), kv_hi = gather_rows(kv_all, rows_hi);
  HostTensor k_all = positions_of(every), k_lo = positions_of(pos_lo), k_hi = positions_of(pos_hi);
  HostTensor o({B, T, H, D}), l({B, H, T}), o2({B, T, H, D}), l2({B, H, T}), o3 = o, l3 = l;
  ops::attention_block_forward(o.t(), l.t(), qkv.t(), kv_all.t(), 0, q_pos.t(), k_all.t(), H, KV);
  ops::attention_block_forward(o2.t(), l2.t(), qkv.t(), kv_lo.t(), 0, q_pos.t(), k_lo.t(), H, KV);
  ops::attention_block_forward(o3.t(), l3.t(), qkv.t(), kv_hi.t(), 0, q_pos.t(), k_hi.t(), H, KV);
  ops::attention_merge(o2.t(), l2.t(), o3.t(), l3.t());
  EXPECT_TRUE(all_close(o2, to_double(o), Tol{1e-5, 1e-6}));
  EXPECT_TRUE(all_close(l2, to_double(l), Tol{1e-5, 1e-6}));
}

// RoPE and the learned-position embedding at explicit positions: the bits of pos_offset form
// for a contiguous run, and each zigzag chunk's rows those of the whole sequence.
TEST(CpBlocks, RopeAndEmbeddingAtPositions) {
  const int64_t B = 2, T = 16, HT = 3, D = 8, C = 8, V = 11;
  const SequenceShard sh = zigzag_shard(T, 2, 1);  // chunks 1 and 2 of 4: positions 4..7, 8..11
  const std::vector<int32_t> pos = sh.positions();
  const int64_t Tl = sh.local;
  HostTensor x = normal({B, T, HT, D}, 11), whole = x;
  ops::rope_forward(whole.t(), 2, 0, 10000.0f);
  HostTensor part = gather_rows(x, pos);
  HostTensor p = positions_of(pos);
  ops::rope_forward(part.t(), 2, 0, 10000.0f, p.t());
  EXPECT_TRUE(bits_equal(part, gather_rows(whole, pos)));
  ops::rope_backward(part.t(), 2, 0, 10000.0f, p.t());
  EXPECT_TRUE(all_close(part, to_double(gather_rows(x, pos)), Tol{1e-6, 1e-6}));

  HostTensor tok = tokens({B, T}, V, 12), wte = normal({V, C}, 13), wpe = normal({T, C}, 14);
  HostTensor emb({B, T, C});
  ops::embedding_forward(emb.t(), tok.t(), wte.t(), wpe.t());
  HostTensor tok_l({B, Tl}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t) tok_l.i32()[b * Tl + t] = tok.i32()[b * T + pos[t]];
  HostTensor emb_l({B, Tl, C});
  ops::embedding_forward(emb_l.t(), tok_l.t(), wte.t(), wpe.t(), 0, 0, 0, p.t());
  HostTensor emb4({B, T, 1, C});
  std::copy_n(emb.f32(), emb.numel(), emb4.f32());
  const HostTensor want = gather_rows(emb4, pos);
  for (int64_t i = 0; i < emb_l.numel(); ++i) EXPECT_EQ(emb_l[i], want[i]) << i;
  // The position gradient lands on the rows of the positions held.
  HostTensor dwte({V, C}), dwpe({T, C});
  ops::embedding_backward(dwte.t(), dwpe.t(), constant({B, Tl, C}, 1.0f).t(), tok_l.t(), 0, 0, 0,
                          p.t());
  for (int64_t t = 0; t < T; ++t) {
    const bool held = std::find(pos.begin(), pos.end(), t) != pos.end();
    EXPECT_EQ(dwpe[t * C], held ? static_cast<float>(B) : 0.0f) << "position " << t;
  }
}

// Causal attention work per rank: the (query, key) pairs a rank's queries see over every rank's
// keys (what the kernels compute, up to their tile granularity). Under the zigzag split they are
// equal on every rank; a contiguous split gives the last rank about 2cp-1 times the first's.
int64_t visible_pairs(const std::vector<int32_t>& q, int64_t T) {
  int64_t n = 0;
  for (int32_t i : q) n += std::min<int64_t>(i + 1, T);
  return n;
}

TEST(CpBlocks, ZigzagSplitBalancesCausalWork) {
  const int64_t T = 4096;
  for (int cp : {2, 4, 8}) {
    std::vector<int64_t> zig, contiguous;
    for (int r = 0; r < cp; ++r) {
      zig.push_back(visible_pairs(zigzag_shard(T, cp, r).positions(), T));
      std::vector<int32_t> block(T / cp);
      for (int64_t t = 0; t < T / cp; ++t) block[t] = static_cast<int32_t>(r * (T / cp) + t);
      contiguous.push_back(visible_pairs(block, T));
    }
    EXPECT_EQ(*std::min_element(zig.begin(), zig.end()), *std::max_element(zig.begin(), zig.end()))
        << "cp " << cp;
    // Contiguous: rank r's pairs grow with r; the last over the first is (2cp-1) + O(cp/T).
    const double ratio = static_cast<double>(contiguous.back()) / static_cast<double>(contiguous[0]);
    EXPECT_NEAR(ratio, 2 * cp - 1, 0.01 * (2 * cp - 1)) << "cp " << cp;
    RecordProperty("contiguous_imbalance_cp" + std::to_string(cp), std::to_string(ratio));
  }
}

TEST(CpBlocks, ZigzagShardHoldsChunksRAnd2cpMinus1MinusR) {
  const SequenceShard s = zigzag_shard(16, 4, 1);  // chunks of 2: 1 and 6
  EXPECT_EQ(s.local, 4);
  EXPECT_EQ(s.positions(), (std::vector<int32_t>{2, 3, 12, 13}));
  // Rows 1..6 of a (2, 4) micro-batch whose first sample is 5: runs of global rows.
  std::vector<std::array<int64_t, 3>> runs;
  s.for_each_run(5, 1, 6, [&](int64_t off, int64_t g, int64_t n) { runs.push_back({off, g, n}); });
  const std::vector<std::array<int64_t, 3>> want{
      {0, 5 * 16 + 3, 1}, {1, 5 * 16 + 12, 2}, {3, 6 * 16 + 2, 2}, {5, 6 * 16 + 12, 1}};
  EXPECT_EQ(runs, want);
  // Without cp a range is one run.
  const SequenceShard one = zigzag_shard(16, 1, 0);
  runs.clear();
  one.for_each_run(2, 3, 20, [&](int64_t off, int64_t g, int64_t n) { runs.push_back({off, g, n}); });
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{0, 2 * 16 + 3, 20}}));
  EXPECT_THROW(zigzag_shard(18, 4, 0), Error);
}

}  // namespace
}  // namespace llmt::test
