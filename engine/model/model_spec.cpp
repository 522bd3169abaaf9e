// Builds the parameter list of the decoder-only transformer from [model] (docs/model.md).
#include "engine/model/model_spec.h"

#include <cmath>

#include "engine/schedule/schedule.h"

namespace llmt {

ModelSpec ModelSpec::from_config(const ModelConfig& cfg) {
  ModelSpec s;
  s.cfg = cfg;
  const int64_t C = cfg.d_model, H = cfg.n_heads, L = cfg.n_layers, V = cfg.vocab_size;
  s.n_kv_heads = cfg.n_kv_heads > 0 ? cfg.n_kv_heads : H;
  s.head_dim = C / H;
  if (cfg.mla_attention()) {
    // The attention core's heads: every query head its own key and value, each [nope | rope]
    // wide, values zero-padded to that width (LatentAttention, blocks.h).
    s.n_kv_heads = H;
    s.head_dim = cfg.mla.qk_head_dim();
  }
  s.qkv_dim = (H + 2 * s.n_kv_heads) * s.head_dim;
  s.ffn_dim = cfg.d_ff;
  s.fc1_out = cfg.activation == Activation::swiglu ? 2 * cfg.d_ff : cfg.d_ff;
  const int64_t gates = cfg.activation == Activation::swiglu ? 2 : 1;
  s.expert_fc1_out = gates * cfg.moe.d_ff_expert;
  s.shared_ffn = cfg.moe.shared_experts * cfg.moe.d_ff_shared;
  s.shared_fc1_out = gates * s.shared_ffn;
  const float std = cfg.init_std;
  const float resid_std = std / std::sqrt(2.0f * static_cast<float>(L));
  const bool ln = cfg.norm == NormKind::layernorm;

  using P = Placement;
  using K = ParamKind;
  int64_t layer = -1;  // the layer the next parameters belong to
  K kind = K::embedding;
  bool in_mtp = false;  // the next parameters are a multi-token prediction module's
  auto add = [&](std::string name, Shape shape, InitKind init, float sd, bool decay, P tp) {
    ParamSpec p{std::move(name), shape, shape, init, sd, decay};
    p.placement[static_cast<int>(Axis::tp)] = std::move(tp);
    p.layer = layer;
    p.kind = kind;
    p.mtp = in_mtp;
    s.params.push_back(std::move(p));
  };
  auto norm = [&](const std::string& prefix) {
    const K outer = kind;
    kind = K::norm;
    add(prefix + ".weight", {C}, InitKind::ones, 0, false, P::replicate());
    if (ln) add(prefix + ".bias", {C}, InitKind::zeros, 0, false, P::replicate());
    kind = outer;
  };
  // Column-parallel: weight rows and bias split (by `segments`); row-parallel: weight columns
  // split, the bias whole (added once, after the partial products are summed).
  auto column = [&](const std::string& prefix, int64_t out, int64_t in, float sd,
                    std::vector<int64_t> segments) {
    add(prefix + ".weight", {out, in}, InitKind::normal, sd, true, P::shard(0, segments));
    if (cfg.bias) add(prefix + ".bias", {out}, InitKind::zeros, 0, false, P::shard(0, segments));
  };
  auto row = [&](const std::string& prefix, int64_t out, int64_t in, float sd) {
    add(prefix + ".weight", {out, in}, InitKind::normal, sd, true, P::shard(1));
    if (cfg.bias) add(prefix + ".bias", {out}, InitKind::zeros, 0, false, P::replicate());
  };
  // Multi-head latent attention (no biases): the down projections to the latents and their
  // RMSNorms replicated over tp, each tp rank projecting its own rows (sequence parallelism), so
  // their gradients are partial over tp; the up projections column-parallel by heads, the output
  // projection row-parallel.
  auto mla = [&](const std::string& prefix) {
    const MlaConfig& a = cfg.mla;
    auto own_rows = [&] { s.params.back().tp_partial_grad = true; };
    auto latent_norm = [&](const std::string& name, int64_t width) {
      kind = K::norm;
      add(name, {width}, InitKind::ones, 0, false, P::replicate());
      own_rows();
      kind = K::attention;
    };
    if (a.q_lora_rank > 0) {
      add(prefix + ".q_a.weight", {a.q_lora_rank, C}, InitKind::normal, std, true, P::replicate());
      own_rows();
      latent_norm(prefix + ".q_a_norm.weight", a.q_lora_rank);
      add(prefix + ".q_b.weight", {H * a.qk_head_dim(), a.q_lora_rank}, InitKind::normal, std, true,
          P::shard(0));
    } else {
      add(prefix + ".q.weight", {H * a.qk_head_dim(), C}, InitKind::normal, std, true, P::shard(0));
    }
    add(prefix + ".kv_a.weight", {a.kv_lora_rank + a.qk_rope_head_dim, C}, InitKind::normal, std,
        true, P::replicate());
    own_rows();
    latent_norm(prefix + ".kv_a_norm.weight", a.kv_lora_rank);
    add(prefix + ".kv_b.weight", {H * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank},
        InitKind::normal, std, true, P::shard(0));
    add(prefix + ".proj.weight", {C, H * a.v_head_dim}, InitKind::normal, resid_std, true,
        P::shard(1));
  };
  const int64_t D = s.head_dim, KV = s.n_kv_heads, F = cfg.d_ff;
  std::vector<int64_t> qkv_segments{H * D, KV * D, KV * D}, fc1_segments;
  if (cfg.activation == Activation::swiglu) fc1_segments = {F, F};

  add("wte.weight", {V, C}, InitKind::normal, std, true, P::shard(0));
  kind = K::position;
  if (cfg.position == PositionKind::learned)
    add("wpe.weight", {cfg.seq_len, C}, InitKind::normal, std, true, P::replicate());
  // A transformer layer: global layer l's blocks (an MTP module's is layer L + k - 1).
  auto add_layer = [&](int64_t l) {
    const std::string p = "layers." + std::to_string(l);
    norm(p + ".norm_1");
    kind = K::attention;
    if (cfg.mla_attention()) {
      mla(p + ".attn");
    } else {
      column(p + ".attn.qkv", s.qkv_dim, C, std, qkv_segments);
      row(p + ".attn.proj", C, H * D, resid_std);
    }
    norm(p + ".norm_2");
    kind = K::mlp;
    if (!cfg.moe.layer(l)) {
      column(p + ".mlp.fc1", s.fc1_out, C, std, fc1_segments);
      row(p + ".mlp.fc2", C, F, resid_std);
      return;
    }
    // A mixture of experts: the router, E experts' stacked fc1/fc2 (no biases), and the shared
    // experts as one dense MLP of width S * d_ff_shared.
    const MoeConfig& e = cfg.moe;
    const int64_t E = e.num_experts, Fe = e.d_ff_expert;
    // Routed: each tp rank routes its own tokens, so the gradients are partial over tp.
    auto routed = [&](P ep) {
      s.params.back().tp_partial_grad = true;
      s.params.back().placement[static_cast<int>(Axis::ep)] = std::move(ep);
    };
    kind = K::router;
    add(p + ".mlp.router.weight", {E, C}, InitKind::normal, std, true, P::replicate());
    routed(P::replicate());
    // Aux-loss-free balancing's bias: not trained by the optimizer (no gradient reaches it); the
    // trainer moves it after each step (docs/model.md).
    kind = K::router_bias;
    if (e.balance == MoeBalance::bias)
      add(p + ".mlp.router.expert_bias", {E}, InitKind::zeros, 0, false, P::replicate());
    kind = K::expert;
    add(p + ".mlp.experts.fc1.weight", {E, s.expert_fc1_out, C}, InitKind::normal, std, true,
        P::replicate());
    routed(P::shard(0));
    add(p + ".mlp.experts.fc2.weight", {E, C, Fe}, InitKind::normal, resid_std, true,
        P::replicate());
    routed(P::shard(0));
    kind = K::mlp;
    if (e.shared_experts > 0) {
      std::vector<int64_t> shared_segments;
      if (cfg.activation == Activation::swiglu) shared_segments = {s.shared_ffn, s.shared_ffn};
      column(p + ".mlp.shared.fc1", s.shared_fc1_out, C, std, shared_segments);
      row(p + ".mlp.shared.fc2", C, s.shared_ffn, resid_std);
    }
  };
  for (int64_t l = 0; l < L; ++l) {
    layer = l;
    add_layer(l);
  }
  layer = -1;
  norm("norm_f");
  kind = K::head;
  if (!cfg.tie_embeddings) add("lm_head.weight", {V, C}, InitKind::normal, std, true, P::shard(0));
  // Multi-token prediction: module k (layer L + k - 1, with the head: ParamSpec::layer -1) norms
  // the embedding of the token k places ahead (enorm) and the previous depth's hidden state
  // (hnorm), projects both (eh_proj, [C, 2C], replicated over tp: each tp rank projects its own
  // rows, so its gradient is partial over tp) to one transformer layer, and norms its output
  // (norm) for the shared head.
  in_mtp = true;
  for (int64_t k = 1; k <= cfg.mtp_depth; ++k) {
    const int64_t l = L + k - 1;
    const std::string p = "layers." + std::to_string(l) + ".mtp";
    norm(p + ".enorm");
    norm(p + ".hnorm");
    kind = K::mlp;
    add(p + ".eh_proj.weight", {C, 2 * C}, InitKind::normal, std, true, P::replicate());
    s.params.back().tp_partial_grad = true;
    add_layer(l);
    norm(p + ".norm");
  }
  s.chunks = {{0, L}};
  return s;
}

ModelSpec ModelSpec::shard_pp(int pp, int virtual_stages, const std::vector<int64_t>& stage_layers,
                              int rank, bool v_shape) const {
  LLMT_CHECK(chunks.size() == 1 && has_embedding && has_head, "shard_pp of a pipeline stage spec");
  LLMT_CHECK(pp >= 1 && virtual_stages >= 1 && rank >= 0 && rank < pp, "pp rank ", rank, " of ", pp,
             " with ", virtual_stages, " virtual stages");
  const int64_t S = static_cast<int64_t>(pp) * virtual_stages, L = cfg.n_layers;
  std::vector<int64_t> count = stage_layers;
  if (count.empty()) {
    LLMT_CHECK(L % S == 0, "model.n_layers=", L, " does not split evenly into ", S,
               " pipeline stages");
    count.assign(static_cast<size_t>(S), L / S);
  }
  LLMT_CHECK(static_cast<int64_t>(count.size()) == S, "parallel.pp_layers has ", count.size(),
             " entries for ", S, " pipeline stages");
  std::vector<int64_t> first(static_cast<size_t>(S) + 1, 0);
  for (int64_t s = 0; s < S; ++s) first[s + 1] = first[s] + count[s];
  LLMT_CHECK(first[S] == L, "parallel.pp_layers sums to ", first[S], ", model.n_layers=", L);
  ScheduleShape order{pp, virtual_stages, 1};
  order.v_shape = v_shape;
  ModelSpec out = *this;
  out.chunks.clear();
  for (int c = 0; c < virtual_stages; ++c) {
    const int64_t s = stage_of(order, rank, c);
    out.chunks.emplace_back(first[s], first[s + 1]);
  }
  out.has_embedding = rank == rank_of(order, 0);
  out.has_head = rank == rank_of(order, static_cast<int>(S) - 1);
  std::vector<bool> held(static_cast<size_t>(L), false);
  for (const auto& [b, e] : out.chunks)
    for (int64_t l = b; l < e; ++l) held[l] = true;
  out.params.clear();
  for (const ParamSpec& p : params) {
    bool keep = false, copy = false;
    if (p.layer >= 0) {
      keep = held[static_cast<size_t>(p.layer)];
    } else if (p.kind == ParamKind::embedding) {
      keep = out.has_embedding || (out.has_head && cfg.embedding_on_last_stage());
      copy = !out.has_embedding;
    } else if (p.kind == ParamKind::position) {
      keep = out.has_embedding;
    } else {  // norm_f, lm_head, the multi-token prediction modules
      keep = out.has_head;
    }
    if (!keep) continue;
    out.params.push_back(p);
    out.params.back().tied_copy = copy;
    out.params.back().placement[static_cast<int>(Axis::pp)] = Placement::owned(rank);
  }
  return out;
}

std::vector<int64_t> ModelSpec::mtp_layers() const {
  std::vector<int64_t> out;
  if (has_head)
    for (int64_t k = 0; k < cfg.mtp_depth; ++k) out.push_back(cfg.n_layers + k);
  return out;
}

int64_t ModelSpec::num_mtp_params() const {
  int64_t n = 0;
  for (const ParamSpec& p : params)
    if (p.mtp) n += p.global_shape.numel();
  return n;
}

std::vector<int64_t> ModelSpec::layers() const {
  std::vector<int64_t> out;
  for (const auto& [b, e] : chunks)
    for (int64_t l = b; l < e; ++l) out.push_back(l);
  return out;
}

ModelSpec ModelSpec::shard_tp(int size, int rank) const {
  LLMT_CHECK(tp_size == 1, "shard_tp of a spec already sharded for tp=", tp_size);
  LLMT_CHECK(ep_size == 1, "shard_tp of a spec sharded for ep=", ep_size, ": shard tp first");
  LLMT_CHECK(size >= 1 && rank >= 0 && rank < size, "tp rank ", rank, " of ", size);
  const auto errors = tensor_parallel_errors(cfg, size, false);
  if (!errors.empty()) throw Error(errors.front().message);
  ModelSpec s = *this;
  s.tp_size = size;
  s.tp_rank = rank;
  for (ParamSpec& p : s.params) p.shape = local_shape(p.global_shape, p.on(Axis::tp), size, p.name);
  return s;
}

std::vector<ShardSlice> ModelSpec::local_slices(size_t i) const {
  // At most one axis shards a parameter (tp: attention, MLP, embeddings; ep: expert stacks).
  const ParamSpec& p = params[i];
  const bool by_ep = ep_size > 1 && p.on(Axis::ep).sharded();
  LLMT_CHECK(!by_ep || tp_size == 1 || !p.on(Axis::tp).sharded(), p.name,
             ": sharded over both tp and ep");
  if (by_ep) return llmt::local_slices(p.global_shape, p.on(Axis::ep), ep_size, ep_rank);
  return llmt::local_slices(p.global_shape, p.on(Axis::tp), tp_size, tp_rank);
}

ModelSpec ModelSpec::without_ep() const {
  ModelSpec s = *this;
  s.ep_size = 1;
  s.ep_rank = 0;
  for (ParamSpec& p : s.params)
    if (p.on(Axis::ep).sharded())
      p.shape = local_shape(p.global_shape, p.on(Axis::tp), tp_size, p.name);
  return s;
}

bool ModelSpec::is_expert(size_t i) const {
  return params[i].kind == ParamKind::expert;
}

bool ModelSpec::is_hidden_matrix(size_t i) const {
  const ParamSpec& p = params.at(i);
  if (p.kind == ParamKind::expert) return p.global_shape.ndim() == 3;
  return (p.kind == ParamKind::attention || p.kind == ParamKind::mlp) && p.global_shape.ndim() == 2;
}

GradGroup ModelSpec::grad_group(size_t i) const {
  const ParamSpec& p = params[i];
  return {ep_size > 1 && p.on(Axis::ep).sharded(), tp_size > 1 && p.tp_partial_grad};
}

std::array<bool, kNumGradGroups> ModelSpec::grad_groups_of_model() const {
  ModelSpec whole = from_config(cfg);
  whole.tp_size = tp_size;
  whole.ep_size = ep_size;
  std::array<bool, kNumGradGroups> used{};
  for (size_t i = 0; i < whole.params.size(); ++i)
    used[static_cast<size_t>(whole.grad_group(i).index())] = true;
  return used;
}

ModelSpec::RowGroup ModelSpec::row_group(size_t i, int size, int rank) const {
  const GradGroup gg = grad_group(i);
  RowGroup g{size, rank};
  if (gg.ep) g = {size / ep_size, rank / ep_size};
  if (gg.tp) g = {g.size * tp_size, tp_rank + tp_size * g.rank};
  return g;
}

int64_t ModelSpec::cut_rows(size_t i) const {
  const Shape& s = params[i].shape;
  return is_expert(i) && s.ndim() >= 3 ? s[0] * s[1] : s[0];
}

ModelSpec ModelSpec::shard_ep(int size, int rank) const {
  LLMT_CHECK(ep_size == 1, "shard_ep of a spec already sharded for ep=", ep_size);
  LLMT_CHECK(size >= 1 && rank >= 0 && rank < size, "ep rank ", rank, " of ", size);
  if (size == 1) return *this;
  const int64_t E = cfg.moe.num_experts;
  LLMT_CHECK(E > 0 && E % size == 0, "model.moe.num_experts=", E,
             " is not divisible by parallel.ep=", size);
  ModelSpec s = *this;
  s.ep_size = size;
  s.ep_rank = rank;
  for (ParamSpec& p : s.params) p.shape = local_shape(p.shape, p.on(Axis::ep), size, p.name);
  return s;
}

int64_t ModelSpec::num_local_params() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.shape.numel();
  return n;
}

std::vector<LayoutRuleError> tensor_parallel_errors(const ModelConfig& cfg, int64_t tp,
                                                    bool sequence_parallel) {
  std::vector<LayoutRuleError> out;
  const int64_t kv = cfg.n_kv_heads > 0 ? cfg.n_kv_heads : cfg.n_heads;
  auto need = [&](const char* key, int64_t value, const char* why, bool sp = false) {
    if (value < 1 || value % tp == 0) return;
    LayoutRuleError e{{key, "parallel.tp"},
                      detail::concat(key, "=", value, " is not divisible by parallel.tp=", tp,
                                     sp ? " with parallel.sequence_parallel=true" : "", ": ", why)};
    if (sp) e.keys.push_back("parallel.sequence_parallel");
    out.push_back(std::move(e));
  };
  if (tp <= 1) return out;
  need("model.n_heads", cfg.n_heads, "each tp rank holds n_heads/tp query heads");
  need("model.n_kv_heads", kv, "each tp rank holds n_kv_heads/tp kv heads");
  need("model.d_ff", cfg.d_ff, "fc1 and fc2 are split over tp along d_ff");
  need("model.vocab_size", cfg.vocab_size,
       "the embedding and head are split over tp by vocabulary rows");
  if (sequence_parallel)
    need("model.seq_len", cfg.seq_len, "norms and dropout hold seq_len/tp positions per rank",
         true);
  return out;
}

int64_t ModelSpec::num_params() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.global_shape.numel();
  return n;
}

size_t ModelSpec::index_of(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return i;
  throw Error("no parameter named " + name);
}

int64_t ModelSpec::num_active_params() const {
  int64_t n = num_params() - num_mtp_params();
  const MoeConfig& e = cfg.moe;
  for (const auto& p : params)
    if (p.kind == ParamKind::expert && !p.mtp)
      n -= p.global_shape.numel() / e.num_experts * (e.num_experts - e.top_k);
  return n;
}

double ModelSpec::matmul_weights(size_t i) const {
  const ParamSpec& p = params.at(i);
  const double n = static_cast<double>(p.global_shape.numel());
  switch (p.kind) {
    case ParamKind::attention:
    case ParamKind::mlp:
    case ParamKind::router:
    case ParamKind::head:
      return p.global_shape.ndim() == 2 ? n : 0.0;  // a bias is added, not multiplied
    case ParamKind::expert:
      return n / static_cast<double>(cfg.moe.num_experts) * static_cast<double>(cfg.moe.top_k);
    case ParamKind::embedding:
      return cfg.tie_embeddings && !p.tied_copy ? n : 0.0;
    case ParamKind::position:
    case ParamKind::norm:
    case ParamKind::router_bias:
      return 0.0;
  }
  return 0.0;
}

double ModelSpec::flops_per_token() const {
  double n = 0;
  for (size_t i = 0; i < params.size(); ++i) n += matmul_weights(i);
  // Multi-token prediction: each module's matmul weights are in n; its attention and its head
  // (the shared weight, multiplied once more per module) are added.
  const double D = static_cast<double>(cfg.mtp_depth);
  return 6.0 * n +
         6.0 * (static_cast<double>(cfg.n_layers) + D) * static_cast<double>(cfg.seq_len) *
             attention_width() +
         6.0 * D * static_cast<double>(cfg.vocab_size * cfg.d_model);
}

double ModelSpec::attention_width() const {
  const double H = static_cast<double>(cfg.n_heads);
  if (cfg.mla_attention())
    return H * static_cast<double>(cfg.mla.qk_head_dim() + cfg.mla.v_head_dim) / 2.0;
  return static_cast<double>(cfg.d_model);
}

}  // namespace llmt
