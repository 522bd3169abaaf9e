// Parameter names, shapes and counts against published model sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/model_spec.h"
#include "engine/model/parallelize.h"

namespace llmt {
namespace {

ModelConfig gpt2_124m() {
  ModelConfig c;  // the defaults are GPT-2 small
  c.d_ff = 4 * c.d_model;
  return c;
}

TEST(ModelSpec, Gpt2SmallHas124439808Parameters) {
  ModelSpec s = ModelSpec::from_config(gpt2_124m());
  EXPECT_EQ(s.num_params(), 124439808);  // Hugging Face gpt2, wpe included, head tied
  EXPECT_EQ(s.params[s.index_of("layers.11.mlp.fc1.weight")].shape, Shape({3072, 768}));
  EXPECT_EQ(s.params[s.index_of("layers.0.attn.qkv.bias")].shape, Shape({2304}));
  EXPECT_THROW(s.index_of("lm_head.weight"), Error);
}

// Meta's Llama-2-7B.
ModelConfig llama2_7b() {
  ModelConfig c = model_preset(Arch::llama);
  c.vocab_size = 32000;
  c.n_layers = 32;
  c.d_model = 4096;
  c.n_heads = 32;
  c.n_kv_heads = 32;
  c.d_ff = preset_d_ff(Arch::llama, 4096);
  c.seq_len = 4096;
  return c;
}

// FLOPs per token count matmuls only: per layer qkv, proj, fc1, fc2 (12 C^2 for GPT-2's 4C MLP),
// plus the head (V C), which a tied embedding is; an untied input embedding is a lookup, and
// biases, norms and learned positions are no matmul. Llama 2 7B: per layer 4 C^2 of attention
// and 3 C F of SwiGLU, the head V C; plus 6 L C T of attention.
TEST(ModelSpec, FlopsPerTokenCountMatmulsOnly) {
  const ModelSpec gpt = ModelSpec::from_config(gpt2_124m());
  const double C = 768, L = 12, V = 50257, T = 1024;
  EXPECT_DOUBLE_EQ(gpt.flops_per_token(), 6 * (L * 12 * C * C + V * C) + 6 * L * C * T);
  const ModelSpec llama = ModelSpec::from_config(llama2_7b());
  const double C2 = 4096, F = 11008, L2 = 32;
  EXPECT_DOUBLE_EQ(llama.flops_per_token(),
                   6 * (L2 * (4 * C2 * C2 + 3 * C2 * F) + 32000 * C2) + 6 * L2 * C2 * 4096);
  // 6.74B parameters, of which the 131M of the input embedding and the norms do no matmul.
  EXPECT_LT(llama.flops_per_token(), 6.0 * static_cast<double>(llama.num_params()) +
                                         6 * L2 * C2 * 4096 - 6 * 32000 * C2 + 1);
}

// Multi-token prediction (DeepSeek-V3 §2.2): module k is layer L + k - 1 with enorm, hnorm,
// eh_proj (C, 2C) and its own final norm; its embedding and head are the model's. Counted apart
// from the model's parameters, in the FLOPs (its weights, its attention, one more head each), and
// held with the head on the last pipeline stage, which then keeps a copy of wte (untied too).
TEST(ModelSpec, MultiTokenPredictionModules) {
  ModelConfig c = llama2_7b();
  const ModelSpec base = ModelSpec::from_config(c);
  c.mtp_depth = 2;
  const ModelSpec s = ModelSpec::from_config(c);
  const int64_t C = 4096, F = 11008, V = 32000, T = 4096;
  const int64_t layer = 4 * C * C + 3 * C * F + 2 * C;  // attention, SwiGLU, two RMSNorms
  const int64_t module = layer + 2 * C * C + 3 * C;     // + eh_proj, enorm, hnorm, norm
  EXPECT_EQ(s.num_mtp_params(), 2 * module);
  EXPECT_EQ(s.num_params(), base.num_params() + 2 * module);
  EXPECT_EQ(s.num_active_params(), base.num_params());  // the model's, as papers count
  EXPECT_EQ(s.params[s.index_of("layers.33.mtp.eh_proj.weight")].shape, Shape({C, 2 * C}));
  EXPECT_EQ(s.params[s.index_of("layers.33.attn.qkv.weight")].shape, Shape({3 * C, C}));
  for (const std::string name : {"layers.32.mtp.enorm.weight", "layers.32.mtp.hnorm.weight",
                                 "layers.32.mtp.norm.weight", "layers.32.mlp.fc2.weight"}) {
    const ParamSpec& p = s.params[s.index_of(name)];
    EXPECT_TRUE(p.mtp) << name;
    EXPECT_EQ(p.layer, -1) << name;  // with the head
  }
  EXPECT_TRUE(s.params[s.index_of("layers.32.mtp.eh_proj.weight")].tp_partial_grad);
  EXPECT_FALSE(s.params[s.index_of("layers.31.mlp.fc2.weight")].mtp);
  EXPECT_DOUBLE_EQ(
      s.flops_per_token() - base.flops_per_token(),
      6.0 * 2 * (4 * C * C + 3 * C * F + 2 * C * C) + 6.0 * 2 * T * C + 6.0 * 2 * V * C);
  // pp 2: the modules and a copy of wte on the last stage, none of them on the first.
  const ModelSpec first = s.shard_pp(2, 1, {}, 0), last = s.shard_pp(2, 1, {}, 1);
  EXPECT_TRUE(first.mtp_layers().empty());
  EXPECT_EQ(last.mtp_layers(), (std::vector<int64_t>{32, 33}));
  EXPECT_THROW(first.index_of("layers.32.mtp.eh_proj.weight"), Error);
  EXPECT_TRUE(last.params[last.index_of("wte.weight")].tied_copy);
  EXPECT_THROW(base.shard_pp(2, 1, {}, 1).index_of("wte.weight"), Error);  // untied, no MTP
}

TEST(ModelSpec, Llama2_7bHas6738415616Parameters) {
  const ModelConfig c = llama2_7b();
  EXPECT_EQ(c.d_ff, 11008);
  ModelSpec s = ModelSpec::from_config(c);
  EXPECT_EQ(s.num_params(), 6738415616);  // Meta's Llama-2-7B
  EXPECT_EQ(s.params[s.index_of("layers.0.mlp.fc1.weight")].shape, Shape({2 * 11008, 4096}));
}

// Hugging Face's exact counts of the Llama 2 and Llama 3 releases (grouped-query attention at
// 70B and in Llama 3, untied embeddings, vocabularies 32000 and 128256).
TEST(ModelSpec, LlamaReleasesHaveTheirPublishedCounts) {
  struct Row {
    const char* name;
    int64_t layers, d_model, heads, kv_heads, d_ff, vocab, params;
  };
  for (const Row& r : {Row{"Llama 2 13B", 40, 5120, 40, 40, 13824, 32000, 13015864320},
                       Row{"Llama 2 70B", 80, 8192, 64, 8, 28672, 32000, 68976648192},
                       Row{"Llama 3 8B", 32, 4096, 32, 8, 14336, 128256, 8030261248},
                       Row{"Llama 3 70B", 80, 8192, 64, 8, 28672, 128256, 70553706496},
                       Row{"Llama 3.1 405B", 126, 16384, 128, 8, 53248, 128256, 405853388800}}) {
    ModelConfig c = model_preset(Arch::llama);
    c.n_layers = r.layers;
    c.d_model = r.d_model;
    c.n_heads = r.heads;
    c.n_kv_heads = r.kv_heads;
    c.d_ff = r.d_ff;
    c.vocab_size = r.vocab;
    EXPECT_EQ(ModelSpec::from_config(c).num_params(), r.params) << r.name;
  }
}

// GPT-3 Table 2.1 (Brown et al. 2020): GPT-2's architecture at context 2048 and vocabulary
// 50257, counts as the paper rounds them (to the digits it prints). Medium is the exception: the
// paper's "350M" is 355.9M counted (1.7% off; it is 356M by every count since).
TEST(ModelSpec, Gpt3TableCountsToThePapersRounding) {
  struct Row {
    const char* name;
    int64_t layers, d_model;
    double params, unit;  // the paper's figure and the unit it rounds to
  };
  for (const Row& r : {Row{"Small", 12, 768, 125e6, 1e6}, Row{"Large", 24, 1536, 760e6, 1e6},
                       Row{"XL", 24, 2048, 1.3e9, 1e8}, Row{"2.7B", 32, 2560, 2.7e9, 1e8},
                       Row{"6.7B", 32, 4096, 6.7e9, 1e8}, Row{"13B", 40, 5140, 13e9, 1e9},
                       Row{"175B", 96, 12288, 175e9, 1e9}, Row{"Medium", 24, 1024, 356e6, 1e6}}) {
    ModelConfig c;
    c.n_layers = r.layers;
    c.d_model = r.d_model;
    c.n_heads = 4;  // the count does not depend on it (13B's 5140 is not a multiple of 40)
    c.d_ff = 4 * r.d_model;
    c.seq_len = 2048;
    const double n = static_cast<double>(ModelSpec::from_config(c).num_params());
    EXPECT_EQ(std::round(n / r.unit) * r.unit, r.params) << r.name << ": " << n;
  }
}

TEST(ModelSpec, GroupedQueryShapesAndInitRules) {
  ModelConfig c = model_preset(Arch::llama);
  c.vocab_size = 100;
  c.n_layers = 2;
  c.d_model = 64;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.d_ff = 96;
  ModelSpec s = ModelSpec::from_config(c);
  EXPECT_EQ(s.qkv_dim, (8 + 2 * 2) * 8);
  const ParamSpec& proj = s.params[s.index_of("layers.1.attn.proj.weight")];
  EXPECT_FLOAT_EQ(proj.std, 0.02f / 2.0f);  // 0.02 / sqrt(2 * 2 layers)
  EXPECT_TRUE(proj.decay);
  EXPECT_FALSE(s.params[s.index_of("norm_f.weight")].decay);
  EXPECT_EQ(s.params[s.index_of("norm_f.weight")].init, InitKind::ones);
}

// A placement on every mesh axis: tp per Megatron's split, pp Owned by the stage once shard_pp
// placed the parameter, cp and dp Replicate (4 layers, pp 2, 2 chunks per rank: rank 1 holds
// layers 1 and 3, the final norm and the head's tied copy of wte).
TEST(ModelSpec, PlacementOnEveryAxis) {
  ModelConfig c = model_preset(Arch::gpt2);
  c.vocab_size = 64;
  c.n_layers = 4;
  c.d_model = 32;
  c.n_heads = 4;
  const ModelSpec whole = ModelSpec::from_config(c);
  const ParamSpec& qkv = whole.params[whole.index_of("layers.1.attn.qkv.weight")];
  EXPECT_EQ(qkv.on(Axis::tp).str(), "Shard(0, [32, 32, 32])");
  EXPECT_EQ(qkv.on(Axis::pp).str(), "Replicate");
  EXPECT_EQ(whole.params[whole.index_of("layers.1.attn.proj.weight")].on(Axis::tp).str(),
            "Shard(1)");
  const ModelSpec r1 = whole.shard_pp(2, 2, {}, 1);
  for (const ParamSpec& p : r1.params) {
    EXPECT_EQ(p.on(Axis::pp).str(), "Owned(1)") << p.name;
    EXPECT_EQ(p.on(Axis::cp).str(), "Replicate") << p.name;
    EXPECT_EQ(p.on(Axis::dp).str(), "Replicate") << p.name;
    EXPECT_EQ(p.on(Axis::tp).str(), whole.params[whole.index_of(p.name)].on(Axis::tp).str());
  }
  EXPECT_EQ(r1.params[r1.index_of("layers.3.mlp.fc1.weight")].on(Axis::tp).str(), "Shard(0)");
  EXPECT_TRUE(r1.params[r1.index_of("wte.weight")].tied_copy);
}

// A Llama-style model of `layers` layers whose layers from 1 on are MoE MLPs (4 experts).
ModelConfig tiny_moe(int64_t layers) {
  ModelConfig c = model_preset(Arch::llama);
  c.vocab_size = 64;
  c.n_layers = layers;
  c.d_model = 32;
  c.n_heads = 4;
  c.d_ff = 64;
  c.moe.num_experts = 4;
  c.moe.d_ff_expert = 32;
  c.moe.first_dense_layers = 1;
  return c;
}

// Every parameter's layer and kind against its name (the one place names are parsed, to check
// what from_config declares): a GPT-2 model with learned positions, biases and an untied head,
// and a Llama MoE model with a dense first layer, bias balancing and a shared expert.
TEST(ModelSpec, LayerAndKindOfEveryParameter) {
  ModelConfig gpt = model_preset(Arch::gpt2);
  gpt.vocab_size = 64;
  gpt.n_layers = 2;
  gpt.d_model = 32;
  gpt.n_heads = 4;
  gpt.tie_embeddings = false;
  ModelConfig moe = tiny_moe(3);
  moe.moe.balance = MoeBalance::bias;
  moe.moe.shared_experts = 1;
  moe.moe.d_ff_shared = 16;
  auto has = [](const std::string& n, const char* part) {
    return n.find(part) != std::string::npos;
  };
  int experts = 0, routers = 0, biases = 0;
  for (const ModelConfig& c : {gpt, moe}) {
    const ModelSpec s = ModelSpec::from_config(c);
    for (const ParamSpec& p : s.params) {
      const bool in_layer = p.name.rfind("layers.", 0) == 0;
      EXPECT_EQ(p.layer, in_layer ? std::stoll(p.name.substr(7)) : -1) << p.name;
      ParamKind want = ParamKind::mlp;
      if (p.name == "wte.weight")
        want = ParamKind::embedding;
      else if (p.name == "wpe.weight")
        want = ParamKind::position;
      else if (p.name == "lm_head.weight")
        want = ParamKind::head;
      else if (has(p.name, "norm"))
        want = ParamKind::norm;
      else if (has(p.name, ".attn."))
        want = ParamKind::attention;
      else if (has(p.name, ".router.expert_bias"))
        want = ParamKind::router_bias;
      else if (has(p.name, ".router."))
        want = ParamKind::router;
      else if (has(p.name, ".experts."))
        want = ParamKind::expert;
      EXPECT_EQ(static_cast<int>(p.kind), static_cast<int>(want)) << p.name;
      experts += p.kind == ParamKind::expert;
      routers += p.kind == ParamKind::router;
      biases += p.kind == ParamKind::router_bias;
    }
  }
  EXPECT_EQ(experts, 4);  // fc1 and fc2 stacks of layers 1 and 2
  EXPECT_EQ(routers, 2);
  EXPECT_EQ(biases, 2);
}

// Expert parallelism is an axis of the placements: the expert stacks are Shard(0) over ep and
// everything else replicated; shard_ep follows the placement (the stack's experts divided, the
// rest unchanged), and a rank's slices of a stack are its run of whole experts.
TEST(ModelSpec, ExpertStacksAreShardedOverEpByTheirPlacement) {
  const ModelSpec spec = ModelSpec::from_config(tiny_moe(3));
  const ModelSpec s = spec.shard_tp(2, 1).shard_ep(2, 1);
  int stacks = 0;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const ParamSpec& p = s.params[i];
    const bool expert = p.kind == ParamKind::expert;
    EXPECT_EQ(p.on(Axis::ep).str(), expert ? "Shard(0)" : "Replicate") << p.name;
    if (!expert) {
      EXPECT_EQ(p.shape, spec.shard_tp(2, 1).params[i].shape) << p.name;
      continue;
    }
    ++stacks;
    EXPECT_EQ(p.shape, p.global_shape.with_dim(0, 2)) << p.name;  // 4 experts over ep 2
    const std::vector<ShardSlice> slices = s.local_slices(i);
    ASSERT_EQ(slices.size(), 1u) << p.name;
    EXPECT_EQ(slices[0].dim, 0);
    EXPECT_EQ(slices[0].global_start, 2);  // ep rank 1: experts 2 and 3
    EXPECT_EQ(slices[0].length, 2);
  }
  EXPECT_EQ(stacks, 4);  // fc1 and fc2 of layers 1 and 2
  // Without ep the stacks are whole again, at the tp rank's shapes.
  const ModelSpec whole = s.without_ep();
  for (size_t i = 0; i < whole.params.size(); ++i)
    EXPECT_EQ(whole.params[i].shape, spec.shard_tp(2, 1).params[i].shape) << whole.params[i].name;
}

// A parameter's gradient group follows from its placements and the sizes the spec is sharded
// for: the expert stacks narrowed to their ep coordinate under ep, the routed parameters (router,
// expert stacks: replicated over tp, gradients partial over tp) widened by tp under tp, the rest
// the dp x cp group; row_group sizes each. The groups the model uses are the same on every
// pipeline stage (a stage holding only dense layers makes the experts' groups too).
TEST(ModelSpec, GradientGroupsFollowThePlacements) {
  ModelConfig c = tiny_moe(4);
  c.moe.first_dense_layers = 2;  // pp 2: stage 0 holds dense layers only
  const ModelSpec spec = ModelSpec::from_config(c);
  for (const int tp : {1, 2})
    for (const int ep : {1, 2}) {
      const ModelSpec s = spec.shard_tp(tp, 0).shard_ep(ep, 0);
      std::array<bool, kNumGradGroups> used{};
      for (size_t i = 0; i < s.params.size(); ++i) {
        const ParamSpec& p = s.params[i];
        const bool expert = p.kind == ParamKind::expert, router = p.kind == ParamKind::router;
        const GradGroup g = s.grad_group(i);
        EXPECT_EQ(g.ep, expert && ep > 1) << p.name << " tp " << tp << " ep " << ep;
        EXPECT_EQ(g.tp, (expert || router) && tp > 1) << p.name << " tp " << tp << " ep " << ep;
        used[static_cast<size_t>(g.index())] = true;
        // In a dp x cp group of 4, at place 3.
        const ModelSpec::RowGroup rg = s.row_group(i, 4, 3);
        EXPECT_EQ(rg.size, (g.ep ? 4 / ep : 4) * (g.tp ? tp : 1)) << p.name;
        EXPECT_EQ(rg.rank, g.tp ? (g.ep ? 3 / ep : 3) * tp : (g.ep ? 3 / ep : 3)) << p.name;
        EXPECT_EQ(GradGroup::of_index(g.index()).index(), g.index());
      }
      EXPECT_EQ(s.grad_groups_of_model(), used) << "tp " << tp << " ep " << ep;
      for (int stage = 0; stage < 2; ++stage)
        EXPECT_EQ(
            spec.shard_pp(2, 1, {}, stage).shard_tp(tp, 0).shard_ep(ep, 0).grad_groups_of_model(),
            used)
            << "stage " << stage;
    }
}

// parallelize composes the stage, the tp shard and the experts in that order, the ep rank being
// the rank's place in its dp x cp group (as MeshShape::group lists it, which is how
// Mesh::expert_group splits it) mod ep: tp 2, cp 2, dp 2, pp 2 with ep 2 (16 ranks).
TEST(Parallelize, StageThenTpThenExperts) {
  const ModelSpec spec = ModelSpec::from_config(tiny_moe(4));
  ModelLayout layout;
  layout.mesh.degree = {2, 2, 2, 2};  // tp, cp, dp, pp
  layout.ep = 2;
  for (int r = 0; r < layout.mesh.world(); ++r) {
    const auto at = layout.mesh.coords(r);
    const std::vector<int> group = layout.mesh.group(r, {Axis::dp, Axis::cp});
    const int place = static_cast<int>(std::find(group.begin(), group.end(), r) - group.begin());
    EXPECT_EQ(expert_rank(layout.mesh, 2, r), place % 2) << "rank " << r;
    const ModelSpec want = spec.shard_pp(2, 1, {}, at[static_cast<int>(Axis::pp)])
                               .shard_tp(2, at[static_cast<int>(Axis::tp)])
                               .shard_ep(2, place % 2);
    const ModelSpec got = parallelize(spec, layout, r);
    EXPECT_EQ(got.tp_rank, want.tp_rank);
    EXPECT_EQ(got.ep_rank, want.ep_rank);
    EXPECT_EQ(got.chunks, want.chunks);
    ASSERT_EQ(got.params.size(), want.params.size());
    for (size_t i = 0; i < got.params.size(); ++i) {
      EXPECT_EQ(got.params[i].name, want.params[i].name);
      EXPECT_EQ(got.params[i].shape, want.params[i].shape) << got.params[i].name;
    }
  }
}

}  // namespace
}  // namespace llmt
