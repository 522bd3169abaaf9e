// Builds the parameter list of the decoder-only transformer from [model] (docs/model.md).
#include "engine/model/model_spec.h"

#include <cmath>

namespace llmt {

ModelSpec ModelSpec::from_config(const ModelConfig& cfg) {
  ModelSpec s;
  s.cfg = cfg;
  const int64_t C = cfg.d_model, H = cfg.n_heads, L = cfg.n_layers, V = cfg.vocab_size;
  s.n_kv_heads = cfg.n_kv_heads > 0 ? cfg.n_kv_heads : H;
  s.head_dim = C / H;
  s.qkv_dim = (H + 2 * s.n_kv_heads) * s.head_dim;
  s.ffn_dim = cfg.d_ff;
  s.fc1_out = cfg.activation == Activation::swiglu ? 2 * cfg.d_ff : cfg.d_ff;
  const float std = cfg.init_std;
  const float resid_std = std / std::sqrt(2.0f * static_cast<float>(L));
  const bool ln = cfg.norm == NormKind::layernorm;

  auto add = [&](std::string name, Shape shape, InitKind init, float sd, bool decay) {
    s.params.push_back({std::move(name), shape, init, sd, decay});
  };
  auto norm = [&](const std::string& prefix) {
    add(prefix + ".weight", {C}, InitKind::ones, 0, false);
    if (ln) add(prefix + ".bias", {C}, InitKind::zeros, 0, false);
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in, float sd) {
    add(prefix + ".weight", {out, in}, InitKind::normal, sd, true);
    if (cfg.bias) add(prefix + ".bias", {out}, InitKind::zeros, 0, false);
  };

  add("wte.weight", {V, C}, InitKind::normal, std, true);
  if (cfg.position == PositionKind::learned)
    add("wpe.weight", {cfg.seq_len, C}, InitKind::normal, std, true);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l);
    norm(p + ".norm_1");
    linear(p + ".attn.qkv", s.qkv_dim, C, std);
    linear(p + ".attn.proj", C, H * s.head_dim, resid_std);
    norm(p + ".norm_2");
    linear(p + ".mlp.fc1", s.fc1_out, C, std);
    linear(p + ".mlp.fc2", C, cfg.d_ff, resid_std);
  }
  norm("norm_f");
  if (!cfg.tie_embeddings) add("lm_head.weight", {V, C}, InitKind::normal, std, true);
  return s;
}

int64_t ModelSpec::num_params() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.shape.numel();
  return n;
}

size_t ModelSpec::index_of(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return i;
  throw Error("no parameter named " + name);
}

double ModelSpec::flops_per_token() const {
  double n = static_cast<double>(num_params());
  if (cfg.position == PositionKind::learned) n -= static_cast<double>(cfg.seq_len * cfg.d_model);
  return 6.0 * n + 6.0 * static_cast<double>(cfg.n_layers * cfg.d_model * cfg.seq_len);
}

}  // namespace llmt
