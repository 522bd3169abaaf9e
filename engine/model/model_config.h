// [model] section: the decoder-only transformer's hyper-parameters (docs/model.md). Lives with
// the model so the model depends only on its own section; train parses it.
#pragma once

#include <cstdint>

#include "engine/parallel/parallel_config.h"
#include "kernels/rope_math.h"

namespace llmt {

class Rules;

enum class Arch : uint8_t { gpt2, llama };
enum class NormKind : uint8_t { layernorm, rmsnorm };
enum class Activation : uint8_t { gelu, swiglu };
enum class PositionKind : uint8_t { learned, rope };
// Activation recompute of a layer ([train] recompute; docs/model.md, "Activation memory"): none
// keeps everything its backward reads; selective drops what its modules rerun in backward (by
// default the attention core's output and log-sum-exp, rerun from the saved qkv); full keeps
// only the layer's input and reruns its forward in backward.
enum class Recompute : uint8_t { none, selective, full };
// What selective recompute reruns in backward ([train] recompute_modules, Megatron-Core's
// --recompute-modules): core_attn the attention core (output and log-sum-exp); layernorm the
// layer's two norms (their outputs, the inputs of qkv and fc1, not saved; the norms' statistics
// are); act the MLP's activation (GELU or SwiGLU; its output, fc2's input, not saved), of the
// dense MLPs and the shared experts; moe_act the routed experts' activation (its output, the
// experts' fc2 input, not saved; under ep not kept with the received rows); mla_up_proj latent
// attention's up projections (the queries, keys and values of every head, the core's input, not
// saved: rerun from the saved latents and the RoPE key). Each reruns the same ops on the same
// saved inputs, so no mode changes a bit of the result.
enum class RecomputeModule : uint8_t { core_attn, layernorm, act, moe_act, mla_up_proj };
struct RecomputeModules {
  uint8_t bits = 1u << static_cast<int>(RecomputeModule::core_attn);
  bool has(RecomputeModule m) const { return (bits >> static_cast<int>(m)) & 1u; }
  bool core_attn() const { return has(RecomputeModule::core_attn); }
  bool layernorm() const { return has(RecomputeModule::layernorm); }
  bool act() const { return has(RecomputeModule::act); }
  bool moe_act() const { return has(RecomputeModule::moe_act); }
  bool mla_up_proj() const { return has(RecomputeModule::mla_up_proj); }
  bool operator==(const RecomputeModules&) const = default;
};
// One layer's recompute: its mode and, under selective, the modules it reruns (none otherwise).
struct LayerRecompute {
  Recompute mode = Recompute::none;
  RecomputeModules modules;
  bool core() const { return mode == Recompute::selective && modules.core_attn(); }
  bool norms() const { return mode == Recompute::selective && modules.layernorm(); }
  bool act() const { return mode == Recompute::selective && modules.act(); }
  bool moe_act() const { return mode == Recompute::selective && modules.moe_act(); }
  bool mla_up() const { return mode == Recompute::selective && modules.mla_up_proj(); }
};
// [model.moe] router: softmax over the experts' logits, or an independent sigmoid per expert.
enum class MoeRouter : uint8_t { softmax, sigmoid };
// Load balancing: the aux loss (Switch), DeepSeek-V3's aux-loss-free bias (a per-expert bias
// added to the scores for selection only, moved after each step by bias_update_rate against the
// step's load), or none.
enum class MoeBalance : uint8_t { aux_loss, bias, none };
// The attention of every layer: multi-head attention (grouped-query when n_kv_heads < n_heads),
// or DeepSeek-V2/V3's multi-head latent attention ([model.mla]).
enum class AttentionKind : uint8_t { mha, mla };

// [model.mla]: multi-head latent attention (DeepSeek-V2 §2.1, V3 §2.1.1; docs/model.md,
// "Multi-head latent attention"), the keys named as Hugging Face's DeepseekV3 config names them.
// Queries come from a low-rank latent of q_lora_rank (0: a full-rank projection), keys and
// values from one of kv_lora_rank, each latent RMS-normalised; every head's query and key are
// [nope | rope] (qk_nope_head_dim + qk_rope_head_dim), the key's rope part one decoupled RoPE key
// shared by all heads; values are v_head_dim wide.
struct MlaConfig {
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool operator==(const MlaConfig&) const = default;
};

// [model.moe]: mixture-of-experts MLPs (docs/model.md, "Mixture of experts"). num_experts = 0
// keeps every MLP dense.
struct MoeConfig {
  int64_t num_experts = 0;  // E
  int64_t top_k = 2;        // k
  int64_t d_ff_expert = 0;  // each expert's hidden width; 0 = model.d_ff
  MoeRouter router = MoeRouter::softmax;
  bool normalize = true;  // the k routing weights divided by their sum (Mixtral); false: Switch
  // Group-limited routing (DeepSeek-V3): the experts are n_group groups of E/n_group consecutive
  // ones; a token picks its top_k among the topk_group groups whose two largest scores (+ bias)
  // sum highest. topk_group 0 = n_group (no limit).
  int64_t n_group = 1;
  int64_t topk_group = 0;
  float routed_scaling_factor = 1.0f;  // the routing weights' factor, after normalize
  MoeBalance balance = MoeBalance::aux_loss;
  float aux_loss_coef = 0.01f;
  float bias_update_rate = 1e-3f;  // balance = "bias": each step's move of an expert's bias
  float z_loss_coef = 0.0f;
  float capacity_factor = 0.0f;  // 0 = dropless; else per sequence and expert
  int64_t shared_experts = 0;    // always-on experts, one MLP of shared_experts * d_ff_shared
  int64_t d_ff_shared = 0;       // 0 = d_ff_expert
  int64_t first_dense_layers = 0;
  int64_t every = 1;  // an MoE MLP on every `every`-th layer from first_dense_layers

  bool enabled() const { return num_experts > 0; }
  // The groups a token may pick from (topk_group, or all when 0).
  int64_t groups_picked() const { return topk_group > 0 ? topk_group : n_group; }
  // Whether global layer l's MLP is a mixture of experts.
  bool layer(int64_t l) const {
    return enabled() && l >= first_dense_layers && (l - first_dense_layers) % every == 0;
  }
};

// [model]. `arch` is a preset: it sets the defaults of norm, activation, position, bias,
// tie_embeddings and d_ff; each may still be set explicitly.
struct ModelConfig {
  Arch arch = Arch::gpt2;
  int64_t vocab_size = 50257;
  int64_t n_layers = 12;
  int64_t d_model = 768;
  int64_t n_heads = 12;
  int64_t n_kv_heads = 0;  // 0 = n_heads
  int64_t d_ff = 0;  // 0 = preset default: 4*d_model (gpt2), 256-multiple of 8/3*d_model (llama)
  int64_t seq_len = 1024;  // training context; also the size of the learned position table
  NormKind norm = NormKind::layernorm;
  Activation activation = Activation::gelu;
  PositionKind position = PositionKind::learned;
  bool bias = true;
  bool tie_embeddings = true;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // [model.rope_scaling]: RoPE's frequencies for a context beyond the pre-training one (linear,
  // Llama 3.1's, YaRN; kernels/rope_math.h, docs/model.md "RoPE scaling"), keys as Hugging
  // Face's rope_scaling names them.
  RopeScaling rope_scaling;
  float dropout = 0.0f;
  float init_std = 0.02f;
  AttentionKind attention = AttentionKind::mha;
  MlaConfig mla;  // read when attention = mla
  MoeConfig moe;
  // Multi-token prediction (DeepSeek-V3 §2.2; docs/model.md, "Multi-token prediction"):
  // mtp_depth sequential modules after the last layer, module k (1..D) predicting from each
  // position the token k+1 places ahead through the shared embedding and head; the mean of their
  // losses times mtp_loss_weight joins the objective (logged as mtp_loss, not in loss).
  int64_t mtp_depth = 0;
  float mtp_loss_weight = 0.3f;

  bool mla_attention() const { return attention == AttentionKind::mla; }
  // Whether a layer (the multi-token prediction modules' included) has a dense MLP or shared
  // experts: an MLP whose activation train.recompute_modules' "act" reruns.
  bool has_unrouted_mlp() const {
    if (moe.shared_experts > 0) return true;
    for (int64_t l = 0; l < n_layers + mtp_depth; ++l)
      if (!moe.layer(l)) return true;
    return false;
  }
  // Whether the last pipeline stage holds a copy of wte: the tied head's, or the multi-token
  // prediction modules' embedding.
  bool embedding_on_last_stage() const { return tie_embeddings || mtp_depth > 0; }
};

// d_ff when [model] leaves it 0: 4*d_model (gpt2), or 8/3*d_model rounded up to a multiple of
// 256 (llama): 256 * ceil(8*d_model / (3*256)).
constexpr int64_t preset_d_ff(Arch arch, int64_t d_model) {
  return arch == Arch::llama ? 256 * ((8 * d_model + 767) / 768) : 4 * d_model;
}

// A config with `arch` and the five switches it presets (docs/model.md); the sizes keep their
// defaults. The one place the presets are defined: config parsing fills unset switches from it.
constexpr ModelConfig model_preset(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  if (arch == Arch::llama) {
    c.norm = NormKind::rmsnorm;
    c.activation = Activation::swiglu;
    c.position = PositionKind::rope;
    c.bias = false;
    c.tie_embeddings = false;
  }
  return c;
}

// [model]'s own rules on the resolved section (raw: as written, before presets and defaults):
// sizes, head divisibility, rope's even head dim, ranges.
void check_model_config(const ModelConfig& m, const ModelConfig& raw, Rules& r);
// [model.rope_scaling]'s rules (called by check_model_config).
void check_rope_scaling(const ModelConfig& m, Rules& r);
// [model.moe]'s rules (called by check_model_config).
void check_moe_config(const ModelConfig& m, Rules& r);
// model.attention's and [model.mla]'s rules (called by check_model_config).
void check_mla_config(const ModelConfig& m, Rules& r);
// model.mtp_depth's and model.mtp_loss_weight's rules (called by check_model_config).
void check_mtp_config(const ModelConfig& m, const ModelConfig& raw, Rules& r);
// What tensor (and sequence) parallelism at p.tp needs of the model's shapes
// (tensor_parallel_errors, model_spec.h), each rule written once.
void check_model_layout(const ModelConfig& m, const ParallelConfig& p, Rules& r);

}  // namespace llmt
