// Parameter names, shapes and counts against published model sizes.
#include <gtest/gtest.h>

#include "engine/model/model_spec.h"

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

TEST(ModelSpec, Llama2_7bHas6738415616Parameters) {
  ModelConfig c = model_preset(Arch::llama);
  c.vocab_size = 32000;
  c.n_layers = 32;
  c.d_model = 4096;
  c.n_heads = 32;
  c.n_kv_heads = 32;
  c.d_ff = preset_d_ff(Arch::llama, 4096);
  EXPECT_EQ(c.d_ff, 11008);
  c.seq_len = 4096;
  ModelSpec s = ModelSpec::from_config(c);
  EXPECT_EQ(s.num_params(), 6738415616);  // Meta's Llama-2-7B
  EXPECT_EQ(s.params[s.index_of("layers.0.mlp.fc1.weight")].shape, Shape({2 * 11008, 4096}));
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

}  // namespace
}  // namespace llmt
