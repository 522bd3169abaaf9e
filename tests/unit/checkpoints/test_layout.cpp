// The checkpoint write rule and box arithmetic (checkpoints/layout.h), no files: for many
// layouts, the pieces all ranks write cover every element of every global tensor exactly once,
// and each rank's local rows land at the right global positions.
#include <gtest/gtest.h>

#include "checkpoints/layout.h"
#include "core/check.h"
#include "tests/unit/tiny_model.h"

namespace llmt::ckpt {
namespace {

ModelSpec tiny(Arch arch) {
  return ModelSpec::from_config(test::tiny_model(arch, {.vocab = 96, .d_model = 32, .seq_len = 8}));
}

// AdamW's, as a run lists them (TrainingState::state_names).
const std::vector<std::string> kAdam = {"param", "exp_avg", "exp_avg_sq"};

MeshShape mesh(int tp, int dp, int cp = 1) {
  MeshShape m;
  m.degree = {tp, cp, dp, 1};
  return m;
}

// Row-major offset of box element `k` (0-based, row-major within the box) in the global tensor.
int64_t global_offset(const std::vector<int64_t>& shape, const Box& b, int64_t k) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t idx = b.start[d] + k % b.count[d];
    k /= b.count[d];
    int64_t stride = 1;
    for (size_t e = d + 1; e < shape.size(); ++e) stride *= shape[e];
    off += idx * stride;
  }
  return off;
}

// Every element of the global tensor t is in exactly one of its mappings' boxes.
void expect_covered_once(const IndexTensor& t, const std::string& where) {
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  std::vector<int> hits(static_cast<size_t>(numel), 0);
  for (const Mapping& m : t.mappings)
    for (int64_t k = 0; k < m.dest.numel(); ++k) ++hits[global_offset(t.shape, m.dest, k)];
  for (int64_t i = 0; i < numel; ++i)
    ASSERT_EQ(hits[i], 1) << t.path << " element " << i << " at " << where;
}

class LayoutTest : public ::testing::TestWithParam<std::tuple<Arch, int, int, int>> {};

TEST_P(LayoutTest, PlanCoversEveryElementOnce) {
  const auto [arch, tp, dp, cp] = GetParam();
  const ModelSpec spec = tiny(arch);
  const std::vector<IndexTensor> plan =
      plan_index(spec, WriteLayout{mesh(tp, dp, cp), 1, {}}, kAdam);
  ASSERT_EQ(plan.size(), 3 * spec.params.size());
  for (const IndexTensor& t : plan)
    expect_covered_once(t, "tp " + std::to_string(tp) + " dp " + std::to_string(dp));
}

// Each rank's local rows, mapped through global_boxes, equal the global tensor's elements: a
// global tensor with value = global offset, sharded as ModelSpec::shard_tp says (local_slices).
TEST_P(LayoutTest, LocalRowsMapToTheirGlobalElements) {
  const auto [arch, tp, dp, cp] = GetParam();
  (void)dp;
  (void)cp;
  const ModelSpec spec = tiny(arch);
  for (int t = 0; t < tp; ++t) {
    const ModelSpec s = spec.shard_tp(tp, t);
    for (size_t i = 0; i < s.params.size(); ++i) {
      const ParamSpec& p = s.params[i];
      const std::vector<int64_t> gshape = whole(p.global_shape).count;
      const int64_t rows = p.shape[0], row_numel = p.shape.numel() / rows;
      // The local tensor built from the slices (values = global offsets).
      std::vector<int64_t> local(static_cast<size_t>(p.shape.numel()));
      for (const ShardSlice& sl : s.local_slices(i)) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < row_numel; ++c) {
            int64_t gr = r, gc = c, lr = r;
            if (sl.dim == 0) {
              if (r < sl.local_start || r >= sl.local_start + sl.length) continue;
              gr = sl.global_start + (r - sl.local_start);
            } else {
              gc = sl.global_start + c;
            }
            local[static_cast<size_t>(lr * row_numel + c)] =
                gr * (p.global_shape.numel() / p.global_shape[0]) + gc;
          }
      }
      // Any run of rows: its boxes read back the same values.
      for (int64_t a = 0; a < rows; a += 3) {
        const int64_t b = std::min(rows, a + 5);
        int64_t covered = 0;
        for (const LocalBox& lb : global_boxes(s, i, a, b)) {
          for (int64_t k = 0; k < lb.global.numel(); ++k)
            ASSERT_EQ(local[static_cast<size_t>(a * row_numel + lb.local_offset + k)],
                      global_offset(gshape, lb.global, k))
                << p.name << " tp rank " << t << " rows [" << a << ", " << b << ")";
          covered += lb.global.numel();
        }
        EXPECT_EQ(covered, (b - a) * row_numel) << p.name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutTest,
                         ::testing::Combine(::testing::Values(Arch::gpt2, Arch::llama),
                                            ::testing::Values(1, 2), ::testing::Values(1, 3, 4),
                                            ::testing::Values(1, 2)));

// Pipeline layouts: each pp rank writes its stage's parameters; the last stage's tied copy of
// wte is not written, yet every element is covered once.
TEST(Layout, PipelineStagesCoverEveryElementOnce) {
  for (Arch arch : {Arch::gpt2, Arch::llama}) {
    ModelConfig c = model_preset(arch);
    c.vocab_size = 96;
    c.n_layers = 4;
    c.d_model = 32;
    c.n_heads = 4;
    c.seq_len = 8;
    c.d_ff = preset_d_ff(arch, c.d_model);
    const ModelSpec spec = ModelSpec::from_config(c);
    for (const WriteLayout& layout :
         {WriteLayout{mesh(1, 1), 1, {}}, WriteLayout{{{2, 1, 2, 2}}, 1, {}},
          WriteLayout{{{1, 1, 1, 2}}, 2, {}}, WriteLayout{{{1, 1, 3, 4}}, 1, {}},
          WriteLayout{{{2, 1, 1, 2}}, 1, {1, 3}}}) {
      for (const IndexTensor& t : plan_index(spec, layout, kAdam))
        expect_covered_once(t, "pp " + std::to_string(layout.mesh.degree[3]));
    }
  }
}

// tp replicas write nothing of a replicated parameter; the ranks of ZeRO's group (dp x cp, in
// rank order) share the rows of every parameter: rank 2 is tp 0, cp 1, the group's second rank.
TEST(Layout, TpReplicasWriteNothingAndTheDpCpGroupSharesTheRows) {
  const ModelSpec spec = tiny(Arch::gpt2);
  const MeshShape m = mesh(2, 1, 2);
  const ModelSpec s0 = spec.shard_tp(2, 0), s1 = spec.shard_tp(2, 1);
  for (const Piece& pc : pieces_to_write(s1, m, 1, kAdam))
    EXPECT_TRUE(s1.params[pc.param].on(Axis::tp).sharded());
  const std::vector<Piece> first = pieces_to_write(s0, m, 0, kAdam);
  const std::vector<Piece> second = pieces_to_write(s0, m, 2, kAdam);
  ASSERT_FALSE(second.empty());
  for (const Piece& pc : second) {
    const int64_t rows = s0.params[pc.param].shape[0], s = (rows + 1) / 2;
    EXPECT_EQ(pc.row_begin, s) << s0.params[pc.param].name;
    EXPECT_EQ(pc.row_end, rows) << s0.params[pc.param].name;
  }
  for (const Piece& pc : first) EXPECT_EQ(pc.row_begin, 0);
  EXPECT_EQ(rank_file_name(12), "rank_00012.h5");
  EXPECT_EQ(shard_dataset("exp_avg", "wte.weight", 1), "optimizer/exp_avg/wte.weight/1");
}

// A Llama-shaped model whose MLPs are 8 experts, top-2, of width `d_ff_expert`.
ModelSpec tiny_moe(int64_t layers, int64_t d_ff_expert) {
  ModelConfig c = test::tiny_model(
      Arch::llama,
      {.vocab = 96, .layers = layers, .d_model = 32, .llama_kv_heads = 4, .seq_len = 8});
  c.moe.num_experts = 8;
  c.moe.top_k = 2;
  c.moe.d_ff_expert = d_ff_expert;
  return ModelSpec::from_config(c);
}

// Mixture of experts under tp: the router and the expert stacks are replicated over tp, but their
// rows are cut over tp x dp x cp (under ep: the expert-data group x tp), every tp rank writing
// some (ModelSpec::row_group, zero.h); every element is still covered once, with and without ep,
// and the rows a rank writes are those ZeRO's shards would give it.
TEST(Layout, RoutedParametersUnderTpAreCutOverTpToo) {
  const ModelSpec spec = tiny_moe(2, 24);
  for (const int ep : {1, 2, 4})
    for (const auto& [tp, dp, cp] : {std::tuple{2, 2, 1}, {2, 4, 1}, {4, 2, 2}, {2, 1, 4}}) {
      if ((dp * cp) % ep != 0) continue;
      const WriteLayout layout{mesh(tp, dp, cp), 1, {}, ep};
      for (const IndexTensor& t : plan_index(spec, layout, kAdam))
        expect_covered_once(t, "tp " + std::to_string(tp) + " dp " + std::to_string(dp) + " cp " +
                                   std::to_string(cp) + " ep " + std::to_string(ep));
      // Rank 1 (tp rank 1, dp x cp place 0) writes rows of the router and of the expert stacks:
      // place 1 of the tp x dp x cp group (of the edp x tp group under ep).
      const ModelSpec held = parallelize(spec, layout, 1);
      bool router = false, experts = false;
      for (const Piece& pc : pieces_to_write(held, layout.mesh, 1, kAdam)) {
        const size_t i = pc.param;
        if (!held.grad_group(i).tp) {
          EXPECT_TRUE(held.params[i].on(Axis::tp).sharded()) << held.params[i].name;
          continue;
        }
        const int n = tp * dp * cp / (held.is_expert(i) ? ep : 1);
        const int64_t rows = held.cut_rows(i), s = (rows + n - 1) / n;
        EXPECT_EQ(pc.row_begin, std::min(rows, s)) << held.params[i].name << " n " << n;
        (held.is_expert(i) ? experts : router) = true;
      }
      EXPECT_TRUE(router && experts) << "tp " << tp << " dp " << dp << " cp " << cp << " ep " << ep;
    }
}

// Hybrid sharding (zero_shard_group N): the ranks of the first N dp coordinates write, each the
// rows ZeRO shards it (those a mesh of dp = N would give the rank at the same coordinates), and
// the other replicas nothing; every element is still covered once. Dense and MoE, with tp, cp
// and ep inside the shard group.
TEST(Layout, HybridShardingFirstReplicaWritesItsShardGroupsRows) {
  for (const bool moe : {false, true}) {
    const ModelSpec spec = moe ? tiny_moe(2, 24) : tiny(Arch::llama);
    for (const auto& [tp, dp, cp, n, ep] : {std::tuple{1, 4, 1, 2, 1},
                                            {2, 4, 1, 1, 1},
                                            {1, 2, 2, 1, 1},
                                            {1, 6, 1, 3, 1},
                                            {1, 4, 1, 2, 2},
                                            {2, 4, 1, 2, 2},
                                            {1, 2, 2, 1, 2}}) {
      if (ep > 1 && !moe) continue;
      const std::string what = detail::concat(moe ? "moe" : "dense", " tp ", tp, " dp ", dp, " cp ",
                                              cp, " shard group ", n, " ep ", ep);
      const WriteLayout layout{mesh(tp, dp, cp), 1, {}, ep, n};
      for (const IndexTensor& t : plan_index(spec, layout, kAdam)) expect_covered_once(t, what);
      const WriteLayout one_replica{mesh(tp, n, cp), 1, {}, ep};
      for (int r = 0; r < layout.mesh.world(); ++r) {
        const auto c = layout.mesh.coords(r);
        const ModelSpec held = parallelize(spec, layout, r);
        const std::vector<Piece> got = pieces_to_write(held, layout.mesh, r, kAdam, n);
        if (c[static_cast<int>(Axis::dp)] >= n) {
          EXPECT_TRUE(got.empty()) << what << " rank " << r;
          continue;
        }
        const int r1 = one_replica.mesh.rank_of(c);
        const std::vector<Piece> want =
            pieces_to_write(parallelize(spec, one_replica, r1), one_replica.mesh, r1, kAdam);
        ASSERT_EQ(got.size(), want.size()) << what << " rank " << r;
        for (size_t k = 0; k < got.size(); ++k)
          EXPECT_TRUE(got[k].param == want[k].param && got[k].state == want[k].state &&
                      got[k].row_begin == want[k].row_begin && got[k].row_end == want[k].row_end)
              << what << " rank " << r << " " << held.params[got[k].param].name;
      }
    }
  }
}

// An expert stack [E, A, B] is cut in rows of (expert, A): any run of an ep rank's rows maps,
// through global_boxes, to exactly its elements of the global tensor (up to three boxes: the rest
// of an expert, whole experts, the start of one), so a group larger than the rank's experts still
// shares them out.
TEST(Layout, ExpertStacksAreCutInRowsOfTheirExperts) {
  const ModelSpec spec = tiny_moe(1, 6);
  for (const int ep : {1, 2, 4}) {
    const ModelSpec s = spec.shard_ep(ep, ep - 1);
    bool seen = false;
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (!s.is_expert(i)) continue;
      seen = true;
      const ParamSpec& p = s.params[i];
      const int64_t rows = s.cut_rows(i), row_numel = p.shape.numel() / rows;
      ASSERT_EQ(rows, p.shape[0] * p.shape[1]) << p.name;
      const std::vector<int64_t> gshape = whole(p.global_shape).count;
      const int64_t per_expert = p.global_shape.numel() / p.global_shape[0];
      // Local element k of this rank's stack is global element first_expert * per_expert + k.
      const int64_t base = (ep - 1) * (8 / ep) * per_expert;
      for (int64_t a = 0; a < rows; a += 5)
        for (int64_t b = a; b <= std::min(rows, a + 3 * p.shape[1] + 2); b += 4) {
          int64_t covered = 0;
          for (const LocalBox& lb : global_boxes(s, i, a, b)) {
            for (int64_t k = 0; k < lb.global.numel(); ++k)
              ASSERT_EQ(base + a * row_numel + lb.local_offset + k,
                        global_offset(gshape, lb.global, k))
                  << p.name << " ep " << ep << " rows [" << a << ", " << b << ")";
            covered += lb.global.numel();
          }
          EXPECT_EQ(covered, (b - a) * row_numel) << p.name;
        }
    }
    EXPECT_TRUE(seen);
  }
}

// The states are whatever the optimizer lists: an optimizer with one state (SGD's momentum) gets
// one optimizer group, covered once like AdamW's, and the names round-trip through the paths.
TEST(Layout, StatesAreWhatTheOptimizerLists) {
  const ModelSpec spec = tiny(Arch::llama);
  const std::vector<std::string> states = {"param", "momentum"};
  const std::vector<IndexTensor> plan = plan_index(spec, WriteLayout{mesh(2, 3), 1, {}}, states);
  ASSERT_EQ(plan.size(), 2 * spec.params.size());
  EXPECT_EQ(plan.front().path, "model/" + spec.params.front().name);
  EXPECT_EQ(plan.back().path, "optimizer/momentum/" + spec.params.back().name);
  for (const IndexTensor& t : plan) {
    int64_t covered = 0, numel = 1;
    for (int64_t d : t.shape) numel *= d;
    for (const Mapping& mp : t.mappings) {
      covered += mp.dest.numel();
      EXPECT_EQ(mp.dataset.rfind(t.path + "/", 0), 0u) << mp.dataset;
    }
    EXPECT_EQ(covered, numel) << t.path;
    const auto [state, name] = split_tensor_path(t.path);
    EXPECT_EQ(tensor_path(state, name), t.path);
  }
  EXPECT_EQ(split_tensor_path("model/wte.weight").first, "param");
  EXPECT_EQ(split_tensor_path("optimizer/exp_avg_sq/wte.weight").first, "exp_avg_sq");
  EXPECT_THROW(split_tensor_path("wte.weight"), Error);
  EXPECT_THROW(split_tensor_path("optimizer/wte.weight"), Error);
  EXPECT_THROW(split_tensor_path("optimizer/a/b/wte.weight"), Error);
  EXPECT_THROW(split_tensor_path("weights/wte.weight"), Error);
}

}  // namespace
}  // namespace llmt::ckpt
