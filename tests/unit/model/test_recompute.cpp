// Activation recompute: the gradients of none / selective (each module: the attention core, the
// norms, the activation, and all three) / full are bitwise equal (with dropout), and the
// activation bytes the allocator counts per layer are exactly the formulas of docs/model.md
// ("Activation memory"), for GPT and Llama at two shapes each, in fp32 and with 16-bit storage;
// likewise the routed experts' activation ("moe_act") of a mixture-of-experts model and latent
// attention's up projections ("mla_up_proj").
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/model/transformer.h"

namespace llmt {
namespace {

// Shapes chosen so every saved tensor is a whole number of 64-byte lines: the formulas are then
// exact without the layout's rounding.
struct Case {
  Arch arch;
  int64_t B, T, C, H, KV, F;
};

ModelConfig config(const Case& k, int64_t layers) {
  ModelConfig c = model_preset(k.arch);
  c.vocab_size = 64;
  c.n_layers = layers;
  c.d_model = k.C;
  c.n_heads = k.H;
  c.n_kv_heads = k.KV;
  c.d_ff = k.F;
  c.seq_len = k.T;
  c.dropout = 0.1f;
  return c;
}

// Bytes one layer saves per micro-batch (docs/model.md), e bytes per 16-bit-capable value (4 in
// fp32, 2 in bf16/fp16): s = T, b = B, h = C, a = H, D = h/a. none: the four residual-stream
// tensors (the layer's input, res_mid and the norms' outputs; e bytes), the norms' statistics
// (mean and rstd for layernorm, rstd for rmsnorm; fp32), qkv and the attention output (e), its
// log-sum-exp (abs, fp32), the MLP's fc1 output and activation output (e).
// selective: without what its modules rerun: the attention output and lse (core_attn), the
// norms' outputs (layernorm), the activation's output (act). full: the layer's input only.
struct Mode {
  Recompute r = Recompute::none;
  RecomputeModules m = {};
};
RecomputeModules modules(std::initializer_list<RecomputeModule> list) {
  RecomputeModules m{0};
  for (RecomputeModule x : list) m.bits |= static_cast<uint8_t>(1u << static_cast<int>(x));
  return m;
}
using enum RecomputeModule;
const Mode kModes[] = {{Recompute::none},
                       {Recompute::selective},
                       {Recompute::full},
                       {Recompute::selective, modules({layernorm})},
                       {Recompute::selective, modules({act})},
                       {Recompute::selective, modules({core_attn, layernorm, act})}};

int64_t formula_bytes(const Case& k, Mode mode, int64_t e = 4) {
  const int64_t sb = k.B * k.T, h = k.C, D = k.C / k.H;
  const bool gpt = k.arch == Arch::gpt2;
  const int64_t F1 = gpt ? k.F : 2 * k.F;
  const int64_t stats = gpt ? 4 * sb : 2 * sb;
  const int64_t qkv = sb * (k.H + 2 * k.KV) * D, lse = k.B * k.H * k.T;
  const int64_t none =
      4 * stats + e * (4 * sb * h + qkv + sb * F1 + sb * k.F) + e * sb * h + 4 * lse;
  switch (mode.r) {
    case Recompute::none:
      return none;
    case Recompute::selective:
      return none - (mode.m.core_attn() ? e * sb * h + 4 * lse : 0) -
             (mode.m.layernorm() ? 2 * e * sb * h : 0) - (mode.m.act() ? e * sb * k.F : 0);
    case Recompute::full:
      return e * sb * h;
  }
  return 0;
}

// The model-wide recompute scratch: selective's attention core, fp32, a norm's output and an
// activation's, e bytes; one layer's full set without its input (the replayed layer's own saved
// input is read) plus the replayed output, fp32 (full).
int64_t formula_scratch(const Case& k, Mode mode, int64_t e = 4) {
  const int64_t sb = k.B * k.T;
  if (mode.r == Recompute::selective)
    return (mode.m.core_attn() ? 4 * (sb * k.C + k.B * k.H * k.T) : 0) +
           (mode.m.layernorm() ? e * sb * k.C : 0) + (mode.m.act() ? e * sb * k.F : 0);
  if (mode.r == Recompute::full) return formula_bytes(k, {}, e) + (4 - e) * sb * k.C;
  return 0;
}

const Case kCases[] = {
    {Arch::gpt2, 2, 32, 64, 4, 4, 256},
    {Arch::gpt2, 1, 48, 96, 6, 6, 384},
    {Arch::llama, 2, 32, 64, 4, 2, 176},
    {Arch::llama, 1, 48, 96, 6, 3, 256},
};

int64_t activation_bytes(const ModelConfig& c, int64_t B, RecomputeOptions r, DType compute) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  Transformer model(ModelSpec::from_config(c), alloc, B, compute, {}, {}, r);
  return alloc.stats().live[static_cast<int>(MemCategory::activations)];
}
int64_t activation_bytes(const Case& k, int64_t layers, RecomputeOptions r,
                         DType compute = DType::f32) {
  return activation_bytes(config(k, layers), k.B, r, compute);
}

TEST(Recompute, ActivationBytesPerLayerAreTheFormulas) {
  for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
    const int64_t e = static_cast<int64_t>(dtype_size(t));
    for (const Case& k : kCases) {
      const int64_t base = activation_bytes(k, 2, {}, t);
      for (const Mode& mode : kModes) {
        const RecomputeOptions r{mode.r, 0, mode.m, false};
        const int64_t two = activation_bytes(k, 2, r, t), four = activation_bytes(k, 4, r, t);
        EXPECT_EQ((four - two) / 2, formula_bytes(k, mode, e))
            << (k.arch == Arch::gpt2 ? "gpt" : "llama") << " C=" << k.C << " mode "
            << static_cast<int>(mode.r) << "/" << int{mode.m.bits} << " " << dtype_name(t);
        // Two layers at the mode against two at none: the layers' difference plus the scratch.
        EXPECT_EQ(two - base, 2 * (formula_bytes(k, mode, e) - formula_bytes(k, {}, e)) +
                                  formula_scratch(k, mode, e))
            << "C=" << k.C << " mode " << static_cast<int>(mode.r) << "/" << int{mode.m.bits} << " "
            << dtype_name(t);
      }
      // recompute_layers = 1 of 4: one layer at full, three at none, plus the replay scratch.
      const Mode full{Recompute::full};
      const int64_t partial = activation_bytes(k, 4, {Recompute::full, 1, {}, false}, t);
      const int64_t none4 = activation_bytes(k, 4, {}, t);
      EXPECT_EQ(partial - none4,
                formula_bytes(k, full, e) - formula_bytes(k, {}, e) + formula_scratch(k, full, e))
          << dtype_name(t);
    }
  }
}

// One step of forward + backward over two micro-batches of model c (k's B and T); the gradients
// as raw bits.
std::vector<float> gradients(const ModelConfig& c, const Case& k, RecomputeOptions r,
                             DType compute) {
  auto backend = make_cpu_backend();
  Allocator alloc(*backend);
  Transformer model(ModelSpec::from_config(c), alloc, k.B, compute, {}, {}, r);
  model.init(11);
  Buffer tok = alloc.allocate_tensor({2, k.B, k.T}, DType::i32, MemCategory::other);
  Tensor tokens = tok.tensor({k.B, k.T}, DType::i32);
  Tensor targets = tok.tensor({k.B, k.T}, DType::i32, static_cast<size_t>(k.B * k.T) * 4);
  std::mt19937 gen(3);
  model.zero_grads();
  for (int micro = 0; micro < 2; ++micro) {
    for (int64_t i = 0; i < k.B * k.T; ++i) {
      tokens.i32()[i] = static_cast<int32_t>(gen() % 64);
      targets.i32()[i] = static_cast<int32_t>(gen() % 64);
    }
    model.forward_backward(tokens, targets, 0.5f, StepContext{5, 2, micro * k.B});
  }
  const Tensor g = model.flat_grads();
  return std::vector<float>(g.f32(), g.f32() + g.numel());
}
std::vector<float> gradients(const Case& k, RecomputeOptions r, DType compute) {
  return gradients(config(k, 3), k, r, compute);
}

TEST(Recompute, GradientsAreBitwiseThoseOfNone) {
  for (const Case& k : {kCases[0], kCases[2]})
    for (DType t : {DType::f32, DType::bf16}) {
      const std::vector<float> none = gradients(k, {}, t);
      std::vector<RecomputeOptions> options;
      for (const Mode& mode : kModes)
        if (mode.r != Recompute::none) options.push_back({mode.r, 0, mode.m, false});
      options.push_back({Recompute::full, 2, {}, false});
      options.push_back({Recompute::selective, 2, modules({layernorm, act}), false});
      for (const RecomputeOptions& r : options) {
        const std::vector<float> g = gradients(k, r, t);
        ASSERT_EQ(g.size(), none.size());
        EXPECT_EQ(std::memcmp(g.data(), none.data(), g.size() * 4), 0)
            << dtype_name(t) << " mode " << static_cast<int>(r.mode) << "/" << int{r.modules.bits}
            << " layers " << r.layers;
      }
    }
}

// A Llama with MoE layers 1.. (E experts of Fe, top-k, a shared expert): "moe_act" drops each
// MoE layer's routed activation output, e M Fe bytes (M = B T k routed rows), held once in the
// model's scratch instead; bitwise gradients with it alone and with every module.
ModelConfig moe_config(const Case& k, int64_t layers, int64_t E, int64_t top, int64_t Fe) {
  ModelConfig c = config(k, layers);
  c.moe.num_experts = E;
  c.moe.top_k = top;
  c.moe.d_ff_expert = Fe;
  c.moe.shared_experts = 1;
  c.moe.d_ff_shared = 32;
  c.moe.first_dense_layers = 1;
  c.moe.z_loss_coef = 1e-3f;
  return c;
}

TEST(Recompute, RoutedExpertsActivationIsRecomputed) {
  const Case k = kCases[2];  // Llama, B 2, T 32, C 64
  const int64_t E = 4, top = 2, Fe = 48, M = k.B * k.T * top;
  const RecomputeOptions moe_act{Recompute::selective, 0, modules({RecomputeModule::moe_act}),
                                 false};
  for (const DType t : {DType::f32, DType::bf16}) {
    const int64_t e = static_cast<int64_t>(dtype_size(t));
    auto bytes = [&](int64_t layers, RecomputeOptions r) {
      return activation_bytes(moe_config(k, layers, E, top, Fe), k.B, r, t);
    };
    // Layers 2 and 3 are MoE layers: e M Fe fewer each.
    EXPECT_EQ((bytes(4, {}) - bytes(2, {})) - (bytes(4, moe_act) - bytes(2, moe_act)),
              2 * e * M * Fe)
        << dtype_name(t);
    // One MoE layer of two: what it does not keep, the scratch holds.
    EXPECT_EQ(bytes(2, moe_act), bytes(2, {})) << dtype_name(t);
  }
  for (const DType t : {DType::f32, DType::bf16}) {
    const ModelConfig c = moe_config(k, 3, E, top, Fe);
    const std::vector<float> none = gradients(c, k, {}, t);
    for (const RecomputeOptions& r :
         {moe_act,
          RecomputeOptions{Recompute::selective, 0,
                           modules({core_attn, layernorm, act, RecomputeModule::moe_act}), false},
          RecomputeOptions{Recompute::selective, 2, modules({RecomputeModule::moe_act}), false}}) {
      const std::vector<float> g = gradients(c, k, r, t);
      ASSERT_EQ(g.size(), none.size());
      EXPECT_EQ(std::memcmp(g.data(), none.data(), g.size() * 4), 0)
          << dtype_name(t) << " modules " << int{r.modules.bits} << " layers " << r.layers;
    }
  }
}

// Latent attention (DeepSeek-V3's at toy ranks: query latent 24, kv latent 16, heads of [nope 8
// | rope 4], values 6 zero-padded to the core's 12): "mla_up_proj" keeps the latents and the
// gathered RoPE key k_pe (B T Dr) instead of the core's input qkv (B T 3H D), which the model's
// scratch holds once; bitwise gradients with it alone, with the core recomputed from the rebuilt
// qkv, and with every module.
ModelConfig mla_config(const Case& k, int64_t layers) {
  ModelConfig c = config(k, layers);
  c.attention = AttentionKind::mla;
  c.n_kv_heads = k.H;
  c.mla = {.q_lora_rank = 24,
           .kv_lora_rank = 16,
           .qk_nope_head_dim = 8,
           .qk_rope_head_dim = 4,
           .v_head_dim = 6};
  return c;
}

TEST(Recompute, LatentAttentionUpProjectionsAreRecomputed) {
  const Case k = kCases[2];  // Llama, B 2, T 32, 4 heads
  const int64_t sb = k.B * k.T, D = 12, Dr = 4;
  const RecomputeOptions up{Recompute::selective, 0, modules({mla_up_proj}), false};
  for (const DType t : {DType::f32, DType::bf16}) {
    const int64_t e = static_cast<int64_t>(dtype_size(t));
    auto bytes = [&](int64_t layers, RecomputeOptions r) {
      return activation_bytes(mla_config(k, layers), k.B, r, t);
    };
    const int64_t qkv = e * sb * 3 * k.H * D, kpe = e * sb * Dr;
    EXPECT_EQ((bytes(4, {}) - bytes(2, {})) - (bytes(4, up) - bytes(2, up)), 2 * (qkv - kpe))
        << dtype_name(t);
    EXPECT_EQ(bytes(2, up) - bytes(2, {}), -2 * (qkv - kpe) + qkv) << dtype_name(t);
  }
  for (const DType t : {DType::f32, DType::bf16}) {
    const ModelConfig c = mla_config(k, 3);
    const std::vector<float> none = gradients(c, k, {}, t);
    for (const RecomputeOptions& r :
         {up, RecomputeOptions{Recompute::selective, 0, modules({core_attn, mla_up_proj}), false},
          RecomputeOptions{Recompute::selective, 0,
                           modules({core_attn, layernorm, act, mla_up_proj}), false},
          RecomputeOptions{Recompute::selective, 2, modules({core_attn, mla_up_proj}), false}}) {
      const std::vector<float> g = gradients(c, k, r, t);
      ASSERT_EQ(g.size(), none.size());
      EXPECT_EQ(std::memcmp(g.data(), none.data(), g.size() * 4), 0)
          << dtype_name(t) << " modules " << int{r.modules.bits} << " layers " << r.layers;
    }
  }
}

}  // namespace
}  // namespace llmt
