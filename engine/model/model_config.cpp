// [model]'s rules (check_model_config) and the tensor-parallel divisibility rules of a model at a
// tp degree, reported through the config's Rules.
#include "engine/model/model_config.h"

#include "config/rules.h"
#include "engine/model/model_spec.h"

namespace llmt {

using detail::concat;

void check_model_config(const ModelConfig& m, const ModelConfig& raw, Rules& r) {
  r.at_least<int64_t>("model.vocab_size", m.vocab_size, 2);
  r.at_least<int64_t>("model.n_layers", m.n_layers, 1);
  r.at_least<int64_t>("model.d_model", m.d_model, 1);
  r.at_least<int64_t>("model.n_heads", m.n_heads, 1);
  if (raw.n_kv_heads != 0) {
    r.at_least<int64_t>("model.n_kv_heads", m.n_kv_heads, 1, ", or 0 for model.n_heads");
  }
  if (m.d_model >= 1) r.at_least<int64_t>("model.d_ff", m.d_ff, 1, ", or 0 for the arch default");
  r.at_least<int64_t>("model.seq_len", m.seq_len, 1);
  // Multi-head latent attention has head dims of its own ([model.mla]).
  if (m.d_model >= 1 && m.n_heads >= 1 && !m.mla_attention()) {
    r.require(m.d_model % m.n_heads == 0, {"model.d_model", "model.n_heads"},
              concat("model.d_model=", m.d_model, " is not divisible by model.n_heads=", m.n_heads,
                     ": the head dim is d_model/n_heads"));
    if (m.d_model % m.n_heads == 0 && m.position == PositionKind::rope) {
      const int64_t head_dim = m.d_model / m.n_heads;
      r.require(
          head_dim % 2 == 0, {"model.position", "model.arch", "model.d_model", "model.n_heads"},
          concat("model.position=\"rope\" needs an even head dim, but model.d_model=", m.d_model,
                 " / model.n_heads=", m.n_heads, " = ", head_dim));
    }
  }
  if (m.n_heads >= 1 && m.n_kv_heads >= 1 && !m.mla_attention()) {
    r.require(m.n_heads % m.n_kv_heads == 0, {"model.n_heads", "model.n_kv_heads"},
              concat("model.n_heads=", m.n_heads, " is not divisible by model.n_kv_heads=",
                     m.n_kv_heads, ": each kv head serves n_heads/n_kv_heads query heads"));
  }
  r.positive("model.norm_eps", m.norm_eps);
  r.positive("model.rope_theta", m.rope_theta);
  r.unit_interval("model.dropout", m.dropout);
  r.at_least("model.init_std", m.init_std, 0.0f);
  r.require(m.init_std <= 1.0f, {"model.init_std"},
            concat("model.init_std=", toml_text(m.init_std),
                   " must be <= 1.0: weights drawn that wide overflow the first forward (GPT-2 "
                   "uses 0.02)"));
  check_moe_config(m, r);
  check_rope_scaling(m, r);
  check_mla_config(m, r);
  check_mtp_config(m, raw, r);
}

void check_rope_scaling(const ModelConfig& m, Rules& r) {
  const RopeScaling& s = m.rope_scaling;
  const std::string type = s.rope_type == RopeType::linear   ? "linear"
                           : s.rope_type == RopeType::llama3 ? "llama3"
                                                             : "yarn";
  if (s.rope_type == RopeType::none) {
    r.require(s == RopeScaling{}, {"model.rope_scaling.rope_type"},
              "[model.rope_scaling] sets a key, but its rope_type is \"none\" (or unset), which "
              "reads none: set model.rope_scaling.rope_type to \"linear\", \"llama3\" or "
              "\"yarn\", or remove the other keys");
    return;
  }
  r.require(m.position == PositionKind::rope, {"model.rope_scaling.rope_type", "model.position"},
            concat("model.rope_scaling.rope_type=\"", type,
                   "\" scales RoPE's frequencies, but model.position=\"learned\" has no RoPE"));
  r.require(s.factor >= 1.0f, {"model.rope_scaling.factor"},
            concat("model.rope_scaling.factor=", toml_text(s.factor),
                   " must be >= 1 (the new context over the original)"));
  if (s.rope_type == RopeType::linear) return;
  r.require(s.original_max_position_embeddings >= 1,
            {"model.rope_scaling.original_max_position_embeddings", "model.rope_scaling.rope_type"},
            concat("model.rope_scaling.rope_type=\"", type,
                   "\" needs the pre-training context, "
                   "model.rope_scaling.original_max_position_embeddings (",
                   s.original_max_position_embeddings, ")"));
  if (s.rope_type == RopeType::llama3) {
    r.require(s.low_freq_factor > 0.0f && s.high_freq_factor > s.low_freq_factor,
              {"model.rope_scaling.low_freq_factor", "model.rope_scaling.high_freq_factor"},
              concat("model.rope_scaling.low_freq_factor=", toml_text(s.low_freq_factor),
                     " and high_freq_factor=", toml_text(s.high_freq_factor),
                     " must satisfy 0 < low < high (Llama 3.1: 1 and 4)"));
    return;
  }
  r.require(s.beta_slow > 0.0f && s.beta_fast > s.beta_slow,
            {"model.rope_scaling.beta_fast", "model.rope_scaling.beta_slow"},
            concat("model.rope_scaling.beta_fast=", toml_text(s.beta_fast),
                   " and beta_slow=", toml_text(s.beta_slow),
                   " must satisfy 0 < beta_slow < beta_fast (YaRN: 32 and 1)"));
  r.at_least("model.rope_scaling.mscale", s.mscale, 0.0f);
  r.at_least("model.rope_scaling.mscale_all_dim", s.mscale_all_dim, 0.0f);
  r.at_least("model.rope_scaling.attention_factor", s.attention_factor, 0.0f,
             " (0 = derived from factor and the mscales)");
}

void check_mtp_config(const ModelConfig& m, const ModelConfig& raw, Rules& r) {
  r.at_least<int64_t>("model.mtp_depth", m.mtp_depth, 0, " (0 = no multi-token prediction)");
  if (m.mtp_depth < 1) {
    r.require(raw.mtp_loss_weight == ModelConfig{}.mtp_loss_weight,
              {"model.mtp_loss_weight", "model.mtp_depth"},
              concat("model.mtp_loss_weight=", toml_text(m.mtp_loss_weight),
                     " is set, but model.mtp_depth=0 has no multi-token prediction module to "
                     "weigh: set model.mtp_depth, or remove model.mtp_loss_weight"));
    return;
  }
  r.at_least("model.mtp_loss_weight", m.mtp_loss_weight, 0.0f);
  if (m.seq_len >= 1)
    r.require(m.mtp_depth < m.seq_len, {"model.mtp_depth", "model.seq_len"},
              concat("model.mtp_depth=", m.mtp_depth,
                     " leaves no position of a sequence of "
                     "model.seq_len=",
                     m.seq_len,
                     " with a token to predict (module k predicts "
                     "position i + k + 1 from position i): use mtp_depth < seq_len"));
}

void check_mla_config(const ModelConfig& m, Rules& r) {
  const MlaConfig& a = m.mla;
  if (!m.mla_attention()) {
    r.require(a == MlaConfig{},
              {"model.attention", "model.mla.q_lora_rank", "model.mla.kv_lora_rank",
               "model.mla.qk_nope_head_dim", "model.mla.qk_rope_head_dim", "model.mla.v_head_dim"},
              "[model.mla] is set, but model.attention=\"mha\" does not read it: set "
              "model.attention = \"mla\", or remove [model.mla]");
    return;
  }
  r.at_least<int64_t>("model.mla.q_lora_rank", a.q_lora_rank, 0,
                      " (0 = a full-rank query projection)");
  r.at_least<int64_t>("model.mla.kv_lora_rank", a.kv_lora_rank, 1);
  r.at_least<int64_t>("model.mla.qk_nope_head_dim", a.qk_nope_head_dim, 1);
  r.at_least<int64_t>("model.mla.qk_rope_head_dim", a.qk_rope_head_dim, 2);
  r.at_least<int64_t>("model.mla.v_head_dim", a.v_head_dim, 1);
  if (a.qk_rope_head_dim >= 2)
    r.require(a.qk_rope_head_dim % 2 == 0, {"model.mla.qk_rope_head_dim"},
              concat("model.mla.qk_rope_head_dim=", a.qk_rope_head_dim,
                     " must be even: RoPE rotates pairs of dims"));
  if (a.qk_nope_head_dim >= 1 && a.qk_rope_head_dim >= 2)
    r.require(a.v_head_dim <= a.qk_head_dim(),
              {"model.mla.v_head_dim", "model.mla.qk_nope_head_dim", "model.mla.qk_rope_head_dim"},
              concat("model.mla.v_head_dim=", a.v_head_dim,
                     " exceeds model.mla.qk_nope_head_dim + qk_rope_head_dim = ", a.qk_head_dim(),
                     ": the attention core holds each head's value in the query/key width "
                     "(zero-padded; docs/model.md, \"Multi-head latent attention\")"));
  r.require(m.position == PositionKind::rope, {"model.attention", "model.position", "model.arch"},
            "model.attention=\"mla\" needs model.position=\"rope\" (the llama preset): its "
            "keys carry position in a decoupled RoPE part");
  r.require(m.n_kv_heads == m.n_heads, {"model.attention", "model.n_kv_heads"},
            concat("model.attention=\"mla\" gives every query head its own key and value ",
                   "(expanded from the shared latent): model.n_kv_heads=", m.n_kv_heads,
                   " must be 0 or model.n_heads=", m.n_heads));
  r.require(!m.bias, {"model.attention", "model.bias", "model.arch"},
            "model.attention=\"mla\" has no biases (DeepSeek-V3's projections have none): set "
            "model.bias = false (the llama preset)");
}

void check_moe_config(const ModelConfig& m, Rules& r) {
  const MoeConfig& e = m.moe;
  r.at_least<int64_t>("model.moe.num_experts", e.num_experts, 0, " (0 = dense MLPs)");
  if (!e.enabled()) return;
  r.at_least<int64_t>("model.moe.top_k", e.top_k, 1);
  if (e.top_k >= 1)
    r.require(e.top_k <= e.num_experts, {"model.moe.top_k", "model.moe.num_experts"},
              concat("model.moe.top_k=", e.top_k, " exceeds model.moe.num_experts=", e.num_experts,
                     ": each token goes to top_k different experts"));
  r.at_least<int64_t>("model.moe.n_group", e.n_group, 1);
  if (e.n_group >= 1) {
    r.require(e.num_experts % e.n_group == 0, {"model.moe.num_experts", "model.moe.n_group"},
              concat("model.moe.num_experts=", e.num_experts,
                     " is not divisible by model.moe.n_group=", e.n_group,
                     ": each group holds num_experts/n_group consecutive experts"));
    r.require(e.topk_group >= 0 && e.topk_group <= e.n_group,
              {"model.moe.topk_group", "model.moe.n_group"},
              concat("model.moe.topk_group=", e.topk_group,
                     " must be in [1, model.moe.n_group=", e.n_group, "], or 0 for every group"));
    if (e.num_experts % e.n_group == 0 && e.topk_group >= 0 && e.topk_group <= e.n_group &&
        e.top_k >= 1)
      r.require(e.top_k <= e.groups_picked() * (e.num_experts / e.n_group),
                {"model.moe.top_k", "model.moe.topk_group", "model.moe.n_group"},
                concat("model.moe.top_k=", e.top_k, " exceeds the ",
                       e.groups_picked() * (e.num_experts / e.n_group),
                       " experts a token may pick from: model.moe.topk_group=", e.topk_group,
                       " of model.moe.n_group=", e.n_group, " groups of ",
                       e.num_experts / e.n_group, " experts"));
  }
  r.positive("model.moe.routed_scaling_factor", e.routed_scaling_factor);
  r.at_least<int64_t>("model.moe.d_ff_expert", e.d_ff_expert, 1, ", or 0 for model.d_ff");
  r.at_least<int64_t>("model.moe.shared_experts", e.shared_experts, 0);
  if (e.shared_experts > 0)
    r.at_least<int64_t>("model.moe.d_ff_shared", e.d_ff_shared, 1, ", or 0 for d_ff_expert");
  r.at_least<int64_t>("model.moe.every", e.every, 1);
  r.at_least<int64_t>("model.moe.first_dense_layers", e.first_dense_layers, 0);
  if (m.n_layers >= 1)
    r.require(e.first_dense_layers < m.n_layers, {"model.moe.first_dense_layers", "model.n_layers"},
              concat("model.moe.first_dense_layers=", e.first_dense_layers,
                     " leaves no MoE layer in model.n_layers=", m.n_layers,
                     "; set model.moe.num_experts=0 for a dense model"));
  r.at_least("model.moe.aux_loss_coef", e.aux_loss_coef, 0.0f);
  r.at_least("model.moe.bias_update_rate", e.bias_update_rate, 0.0f);
  r.at_least("model.moe.z_loss_coef", e.z_loss_coef, 0.0f);
  r.at_least("model.moe.capacity_factor", e.capacity_factor, 0.0f, " (0 = dropless)");
}

void check_model_layout(const ModelConfig& m, const ParallelConfig& p, Rules& r) {
  if (p.tp < 1 || p.cp < 1) return;  // reported by check_parallel_config
  if (p.ep > 1) {
    r.require(m.moe.enabled(), {"parallel.ep", "model.moe.num_experts"},
              concat("parallel.ep=", p.ep,
                     " splits experts, but the model has none: set "
                     "[model.moe] num_experts, or parallel.ep = 1"));
    if (m.moe.enabled())
      r.require(m.moe.num_experts % p.ep == 0, {"model.moe.num_experts", "parallel.ep"},
                concat("model.moe.num_experts=", m.moe.num_experts,
                       " is not divisible by parallel.ep=", p.ep,
                       ": each ep rank holds num_experts/ep experts"));
  }
  if (m.mla_attention() && p.tp > 1)
    r.require(p.sequence_parallel, {"model.attention", "parallel.tp"},
              concat("model.attention=\"mla\" with parallel.tp=", p.tp,
                     ": each tp rank projects its own rows of the sequence down to the latents, "
                     "which are gathered over tp; set parallel.sequence_parallel = true"));
  if (!p.cp_latent)
    r.require(
        m.mla_attention(), {"parallel.cp_latent", "model.attention"},
        "parallel.cp_latent=false makes context parallelism move latent attention's "
        "expanded K/V instead of its kv latent, but model.attention=\"mha\" has no latent: remove "
        "parallel.cp_latent");
  if (m.mtp_depth > 0 && p.tp > 1)
    r.require(p.sequence_parallel, {"model.mtp_depth", "parallel.tp"},
              concat("model.mtp_depth=", m.mtp_depth, " with parallel.tp=", p.tp,
                     ": each tp rank projects its own rows of the sequence through the "
                     "multi-token prediction modules' eh_proj; set parallel.sequence_parallel = "
                     "true"));
  if (m.moe.enabled()) {
    // Under tp each rank routes the rows sequence parallelism gives it, with the experts and
    // the router replicated over tp (docs/parallelism.md, "Mixture of experts").
    if (p.tp > 1) {
      const std::string moe_tp =
          concat("model.moe.num_experts=", m.moe.num_experts, " with parallel.tp=", p.tp);
      r.require(p.sequence_parallel, {"model.moe.num_experts", "parallel.tp"},
                concat(moe_tp,
                       ": mixture-of-experts layers under tp route each rank's rows of "
                       "the sequence; set parallel.sequence_parallel = true"));
    }
  }
  for (const LayoutRuleError& e : tensor_parallel_errors(m, p.tp, p.sequence_parallel))
    r.require(false, e.keys, e.message);
  if (p.cp == 1 || m.seq_len < 1) return;
  // Context parallelism (engine/parallel/context_parallel.h): the zigzag split gives each cp rank
  // chunks r and 2cp-1-r of 2cp; Ulysses also splits every tp rank's heads over cp.
  const int64_t cp = p.cp, chunks = 2 * cp;
  r.require(m.seq_len % chunks == 0, {"model.seq_len", "parallel.cp"},
            concat("model.seq_len=", m.seq_len, " is not divisible by 2*parallel.cp=", chunks,
                   ": each cp rank holds 2 of 2*cp equal chunks of every sequence (chunks r and "
                   "2cp-1-r, so that causal attention costs every rank the same)"));
  if (p.sequence_parallel && p.tp > 1 && m.seq_len % chunks == 0)
    r.require((m.seq_len / cp) % p.tp == 0,
              {"model.seq_len", "parallel.cp", "parallel.tp", "parallel.sequence_parallel"},
              concat("model.seq_len/parallel.cp=", m.seq_len / cp,
                     " positions per cp rank are not divisible by parallel.tp=", p.tp,
                     " with parallel.sequence_parallel=true"));
  const int64_t u = p.cp_impl == CpImpl::ulysses  ? cp
                    : p.cp_impl == CpImpl::hybrid ? p.cp_ulysses
                                                  : 1;
  if (u > 1) {
    const int64_t kv = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
    for (const auto& [key, n] : {std::pair<const char*, int64_t>{"model.n_heads", m.n_heads},
                                 std::pair<const char*, int64_t>{"model.n_kv_heads", kv}}) {
      if (n < 1 || n % p.tp != 0) continue;  // the tp rule above reports it
      const bool hybrid = p.cp_impl == CpImpl::hybrid;
      r.require((n / p.tp) % u == 0,
                {key, hybrid ? "parallel.cp_ulysses" : "parallel.cp", "parallel.cp_impl"},
                concat(key, "=", n, " over parallel.tp=", p.tp, " is ", n / p.tp,
                       " heads per tp rank, not divisible by ",
                       hybrid ? "parallel.cp_ulysses=" : "parallel.cp=", u,
                       ": the all-to-all of parallel.cp_impl=\"", cp_impl_name(p.cp_impl),
                       "\" gives each of its ranks 1/", u,
                       " of every tp rank's query and kv heads; use cp_impl=\"ring\""));
    }
  }
}

}  // namespace llmt
