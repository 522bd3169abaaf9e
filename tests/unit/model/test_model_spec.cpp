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

}  // namespace
}  // namespace llmt
