// The blocks' forward and backward as sequences of ops and tensor-parallel layers (blocks.h).
// Every activation and gradient that is an op's output is rounded to the compute type where the
// 16-bit storage it emulates would round it.
#include "engine/model/blocks.h"

#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "kernels/ops.h"

namespace llmt {

size_t spec_bytes(const std::vector<TensorSpec>& specs) {
  TensorLayout count;
  count.take_all(specs);
  return count.bytes();
}

namespace {

// `specs` laid out in a fresh buffer of `category` (into `buf`), their tensors in order.
std::vector<Tensor> allocate_specs(Allocator& alloc, const std::vector<TensorSpec>& specs,
                                   MemCategory category, Buffer& buf) {
  const size_t bytes = spec_bytes(specs);
  buf = alloc.allocate(bytes, category);
  TensorLayout lay(buf.tensor({static_cast<int64_t>(bytes / 4)}, DType::f32));
  return lay.take_all(specs);
}

}  // namespace

Tensor TensorLayout::take(Shape s, DType t) {
  const size_t used = static_cast<size_t>(s.numel()) * dtype_size(t);
  Tensor out;
  if (region_.defined()) {
    LLMT_CHECK(offset_ + used <= region_.nbytes(), "layout of ", s.str(), " ", dtype_name(t),
               " at byte ", offset_, " overruns its region ", describe(region_));
    out = Tensor(static_cast<char*>(region_.data) + offset_, s, t, region_.device);
  }
  offset_ += (used + 63) / 64 * 64;
  return out;
}

std::vector<Tensor> TensorLayout::take_all(const std::vector<TensorSpec>& specs) {
  std::vector<Tensor> out;
  out.reserve(specs.size());
  for (const TensorSpec& s : specs) out.push_back(take(s.shape, s.dtype));
  return out;
}

Tensor Stash::keep(size_t i, Tensor t) {
  if (!persistent_) {
    entries_[i] = t;
    return t;
  }
  ops::copy(entries_[i], t);
  return entries_[i];
}

int64_t BlockEnv::param(const std::string& name) const {
  const int64_t i = param_opt(name);
  if (i < 0) throw Error("no parameter named " + name);
  return i;
}

int64_t BlockEnv::param_opt(const std::string& name) const {
  const auto it = index.find(name);
  return it == index.end() ? -1 : it->second;
}

namespace {

// This rank's head and ffn counts.
struct LocalDims {
  int64_t H, KV, D, Q, F, F1, C, V;
};

LocalDims local_dims(const ModelSpec& spec, int tp) {
  LocalDims d;
  d.H = spec.cfg.n_heads / tp;
  d.KV = spec.n_kv_heads / tp;
  d.D = spec.head_dim;
  d.Q = (d.H + 2 * d.KV) * d.D;
  d.F = spec.ffn_dim / tp;
  d.F1 = spec.fc1_out / tp;
  d.C = spec.cfg.d_model;
  d.V = spec.cfg.vocab_size / tp;
  return d;
}

// The first s.numel() elements of buf, as shape s (a scratch buffer sized for the widest use).
Tensor head_of(Tensor buf, Shape s) {
  LLMT_CHECK(s.numel() <= buf.numel(), "scratch ", describe(buf), " is smaller than ", s.str());
  return Tensor(buf.data, s, buf.dtype, buf.device);
}

// An f32 layout entry holding i32 values (an index tensor among saved activations).
Tensor as_i32(Tensor t) {
  return Tensor(t.data, t.shape, DType::i32, t.device);
}

}  // namespace

int64_t moe_capacity(const MoeConfig& moe, int64_t seq_len) {
  if (moe.capacity_factor <= 0.0f) return 0;
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(moe.capacity_factor) * seq_len * moe.top_k / moe.num_experts));
}

// ---- Norm ---------------------------------------------------------------------------------------

Norm::Norm(const BlockEnv& env, const std::string& prefix)
    : env_(env),
      layernorm_(env.spec.cfg.norm == NormKind::layernorm),
      w_(env.param(prefix + ".weight")),
      b_(env.param_opt(prefix + ".bias")) {}

std::vector<TensorSpec> Norm::saved() const {
  const int64_t R = env_.tp.R;
  if (!layernorm_) return {{"rstd", {R}}};
  return {{"mean", {R}}, {"rstd", {R}}};
}

std::vector<TensorSpec> Norm::stash() const {
  // One tensor, so that SP completes weight and bias with one all-reduce.
  return {{"d_weight_bias", {b_ >= 0 ? 2 : 1, env_.spec.cfg.d_model}}};
}

void Norm::forward(std::span<const Tensor> s, Tensor out, Tensor in) const {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  const float eps = env_.spec.cfg.norm_eps;
  if (layernorm_)
    ops::layernorm_forward(out.view({R, C}), s[0], s[1], in.view({R, C}), env_.w(w_), env_.w(b_),
                           eps);
  else
    ops::rmsnorm_forward(out.view({R, C}), s[0], in.view({R, C}), env_.w(w_), eps);
  env_.round(out);
}

void Norm::backward_input(std::span<const Tensor> s, Stash& st, Tensor din, Tensor dout,
                          Tensor in) const {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  Tensor partial = st[0];  // (1 or 2, C): the kernel adds into it
  ops::fill_zero(partial);
  Tensor dw = partial.rows(0, 1).view({C});
  if (layernorm_)
    ops::layernorm_backward(din.view({R, C}), dw, b_ >= 0 ? partial.rows(1, 2).view({C}) : Tensor(),
                            dout.view({R, C}), in.view({R, C}), env_.w(w_), s[0], s[1]);
  else
    ops::rmsnorm_backward(din.view({R, C}), dw, dout.view({R, C}), in.view({R, C}), env_.w(w_),
                          s[0]);
  env_.round(din);
  sum_sequence_partials(env_.tp, partial);
}

void Norm::backward_weight(const Stash& st) const {
  const int64_t C = env_.spec.cfg.d_model;
  ops::add_inplace(env_.g(w_), st[0].rows(0, 1).view({C}));
  if (b_ >= 0) ops::add_inplace(env_.g(b_), st[0].rows(1, 2).view({C}));
}

// ---- Attention ----------------------------------------------------------------------------------

namespace {

// The core's output and LSE of an attention block's saved set s = [qkv, att, lse, ...]: s[1],
// s[2], or under selective recompute ([qkv, ...]) recomputed from qkv into the model's scratch
// unless it holds them already for the saved set `key` (scratch.core_of), by run(out, lse)
// (default: the core's forward on qkv).
template <typename Run>
std::pair<Tensor, Tensor> attention_core(const BlockEnv& env, bool recompute,
                                         std::span<const Tensor> s, const void* key, Run&& run) {
  if (!recompute) return {s[1], s[2]};
  BlockScratch& sc = env.scratch;
  if (sc.core_of != key) {
    run(sc.core_att, sc.core_lse);
    env.round(sc.core_att);
    sc.core_of = key;
  }
  return {sc.core_att, sc.core_lse};
}
std::pair<Tensor, Tensor> attention_core(const BlockEnv& env, bool recompute,
                                         std::span<const Tensor> s) {
  return attention_core(env, recompute, s, s[0].data,
                        [&](Tensor out, Tensor lse) { env.attention.forward(out, lse, s[0]); });
}

// The core's saved tensors: qkv (B,T,H+2KV,D) [, att (B,T,H,D), lse (B,H,T)].
std::vector<TensorSpec> core_saved(const BlockEnv& env, int64_t H, int64_t KV, int64_t D,
                                   bool recompute) {
  const int64_t B = env.B, T = env.T;
  const DType t = env.tp.compute;
  std::vector<TensorSpec> out{{"qkv", {B, T, H + 2 * KV, D}, false, t}};
  if (!recompute) {
    out.push_back({"att", {B, T, H, D}, false, t});
    out.push_back({"lse", {B, H, T}});
  }
  return out;
}

}  // namespace

Attention::Attention(const BlockEnv& env, const std::string& prefix, bool recompute_core)
    : env_(env),
      recompute_core_(recompute_core),
      qkv_w_(env.param(prefix + ".qkv.weight")),
      qkv_b_(env.param_opt(prefix + ".qkv.bias")),
      proj_w_(env.param(prefix + ".proj.weight")),
      proj_b_(env.param_opt(prefix + ".proj.bias")),
      qkv_(env.tp, true),
      proj_(env.tp, true) {}

std::vector<TensorSpec> Attention::saved() const {
  const LocalDims d = local_dims(env_.spec, env_.tp.tp.size());
  return core_saved(env_, d.H, d.KV, d.D, recompute_core_);
}

std::vector<TensorSpec> Attention::stash() const {
  const LocalDims d = local_dims(env_.spec, env_.tp.tp.size());
  const int64_t N = env_.tp.N;
  return {{"d_proj_out", {N, d.C}, true}, {"d_qkv_out", {N, d.Q}, true}};
}

std::pair<Tensor, Tensor> Attention::core(std::span<const Tensor> s) {
  return attention_core(env_, recompute_core_, s);
}

Tensor Attention::forward(std::span<const Tensor> s, Tensor x) {
  const LocalDims d = local_dims(env_.spec, env_.tp.tp.size());
  const auto& cfg = env_.spec.cfg;
  const int64_t N = env_.tp.N;
  Tensor qkv = s[0];  // (B,T,H+2KV,D)
  // The projection and RoPE in fp32, rounded once: in place, or (16-bit qkv) in the backward's
  // d_qkv scratch, free during a forward, then stored.
  const Tensor work = qkv.dtype == DType::f32 ? qkv : env_.scratch.d_qkv;
  qkv_.forward(work.view({N, d.Q}), qkv_.input(x), env_.w(qkv_w_), env_.w(qkv_b_));
  if (cfg.position == PositionKind::rope)
    ops::rope_forward(work, d.H + d.KV, 0, cfg.rope_theta, env_.positions(), {}, cfg.rope_scaling);
  if (work.data == qkv.data)
    env_.round(qkv);
  else
    ops::convert(qkv, work);
  if (recompute_core_) env_.scratch.core_of = nullptr;  // recomputed below from this qkv
  const auto [att, lse] = core(s);
  if (!recompute_core_) {
    env_.attention.forward(att, lse, qkv);  // qkv holds 16-bit values
    env_.round(att);
  }
  Tensor y = proj_.forward(att.view({N, d.H * d.D}), env_.w(proj_w_), env_.w(proj_b_));
  env_.round(y);
  return y;
}

Tensor Attention::backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) {
  const LocalDims d = local_dims(env_.spec, env_.tp.tp.size());
  const auto& cfg = env_.spec.cfg;
  const BlockScratch& sc = env_.scratch;
  const int64_t N = env_.tp.N;
  const auto [att, lse] = core(s);
  st.keep(0, proj_.backward_input(sc.d_att.view({N, d.H * d.D}), dy, env_.w(proj_w_)));
  env_.round(sc.d_att);
  env_.attention.backward(sc.d_qkv, sc.d_att, s[0], att, lse);
  if (cfg.position == PositionKind::rope)
    ops::rope_backward(sc.d_qkv, d.H + d.KV, 0, cfg.rope_theta, env_.positions(), {},
                       cfg.rope_scaling);
  env_.round(sc.d_qkv);
  Tensor dqkv = st.keep(1, sc.d_qkv.view({N, d.Q}));
  return qkv_.backward_input(sc.d_c, dqkv, env_.w(qkv_w_));
}

void Attention::backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) {
  const LocalDims d = local_dims(env_.spec, env_.tp.tp.size());
  const int64_t N = env_.tp.N;
  const Tensor att = core(s).first;
  proj_.backward_weight(env_.g(proj_w_), env_.g(proj_b_), st[0], att.view({N, d.H * d.D}));
  qkv_.backward_weight(env_.g(qkv_w_), env_.g(qkv_b_), st[1], qkv_.input(x));
}

// ---- LatentAttention ----------------------------------------------------------------------------

LatentAttention::LatentAttention(const BlockEnv& env, const std::string& prefix,
                                 bool recompute_core, bool recompute_up)
    : env_(env),
      recompute_core_(recompute_core),
      recompute_up_(recompute_up),
      H_(env.spec.cfg.n_heads / env.tp.tp.size()),
      Dn_(env.spec.cfg.mla.qk_nope_head_dim),
      Dr_(env.spec.cfg.mla.qk_rope_head_dim),
      Dv_(env.spec.cfg.mla.v_head_dim),
      D_(env.spec.cfg.mla.qk_head_dim()),
      Cq_(env.spec.cfg.mla.q_lora_rank),
      Ckv_(env.spec.cfg.mla.kv_lora_rank),
      payload_(env.attention.payload_width() > 0),
      W_(core_heads(env.attention, H_)),
      lat_(recompute_core ? 1 : 3),
      q_a_(env.param_opt(prefix + ".q_a.weight")),
      q_norm_(env.param_opt(prefix + ".q_a_norm.weight")),
      q_up_w_(env.param(prefix + (Cq_ > 0 ? ".q_b.weight" : ".q.weight"))),
      kv_a_(env.param(prefix + ".kv_a.weight")),
      kv_norm_(env.param(prefix + ".kv_a_norm.weight")),
      kv_up_w_(env.param(prefix + ".kv_b.weight")),
      proj_w_(env.param(prefix + ".proj.weight")),
      q_up_(env.tp, true),
      kv_up_(env.tp, true),
      proj_(env.tp, true) {
  LLMT_CHECK(env.tp.tp.size() == 1 || env.tp.sp(),
             "latent attention under tp needs sequence parallelism (each rank projects its rows)");
  LLMT_CHECK(Dv_ <= D_ && env.spec.head_dim == D_, "latent attention: v_head_dim ", Dv_,
             " above the core's head dim ", D_);
  LLMT_CHECK(!payload_ || env.attention.payload_width() == Ckv_ + Dr_,
             "latent attention: the cp core's payload of ", env.attention.payload_width(),
             " values a position is not kv_lora_rank + qk_rope_head_dim = ", Ckv_ + Dr_);
  LLMT_CHECK(!recompute_up_ || (Cq_ > 0 && env.scratch.mla.qkv.defined()), prefix,
             ": recomputing the up projections needs a query latent and the model's scratch");
}

std::vector<TensorSpec> LatentAttention::saved() const {
  const int64_t R = env_.tp.R, N = env_.tp.N;
  const DType t = env_.tp.compute;
  std::vector<TensorSpec> out = core_saved(env_, H_, H_, D_, recompute_core_);
  out[0].shape = recompute_up_ ? Shape{0, W_, D_} : Shape{env_.B, env_.T, W_, D_};
  if (Cq_ > 0) {
    out.push_back({"q_a", {R, Cq_}, false, t});
    out.push_back({"q_rstd", {R}});
    out.push_back({"q_latent", {N, Cq_}, false, t});
  }
  out.push_back({"c", {R, Ckv_}, false, t});
  out.push_back({"kv_rstd", {R}});
  out.push_back({"kv_latent", {N, Ckv_}, false, t});
  if (recompute_up_) out.push_back({"k_pe", {N, Dr_}, false, t});
  return out;
}

std::vector<TensorSpec> LatentAttention::stash() const {
  const int64_t R = env_.tp.R, N = env_.tp.N, C = env_.spec.cfg.d_model;
  std::vector<TensorSpec> out{{"d_proj_out", {N, C}, true},
                              {"d_q", {N, H_ * D_}, true},
                              {"d_kv", {N, H_ * (Dn_ + Dv_)}, true},
                              {"d_kv_a", {R, Ckv_ + Dr_}, true}};
  if (Cq_ > 0) out.push_back({"d_q_a", {R, Cq_}, true});
  out.push_back({"d_norms", {Cq_ + Ckv_}});
  return out;
}

Tensor LatentAttention::values_of(Tensor att, Tensor into) const {
  const int64_t N = env_.tp.N;
  if (Dv_ == D_) return att.view({N, H_ * Dv_});
  Tensor o = head_of(into, {N, H_ * Dv_});
  ops::copy_blocks(o, att.view({N, H_ * D_}), {H_, Dv_, 0, Dv_, 0, D_});
  return o;
}

int64_t LatentAttention::core_heads(const AttentionCore& core, int64_t H) {
  return core.payload_width() > 0 && !core.reads_own_kv() ? H + 1 : 3 * H;
}

Tensor LatentAttention::qkv_of(std::span<const Tensor> s) const {
  if (!recompute_up_) return s[0];
  BlockScratch::Mla& m = env_.scratch.mla;
  const Tensor kv_latent = s[kv_latent_at()];
  if (m.qkv_of != kv_latent.data) {
    build_qkv(m.qkv, head_of(env_.scratch.d_att, {env_.tp.N, H_ * D_}), s[lat_ + 2], kv_latent,
              s[kv_latent_at() + 1]);
    m.qkv_of = kv_latent.data;
  }
  return m.qkv;
}

void LatentAttention::build_qkv(Tensor qkv, Tensor q, Tensor q_latent, Tensor kv_latent,
                                Tensor k_pe) const {
  const auto& cfg = env_.spec.cfg;
  const BlockScratch::Mla& m = env_.scratch.mla;
  const int64_t N = env_.tp.N;
  // A core that expands every block's K/V from the payloads (W = H + 1) reads only the queries
  // and the rotated k_pe (fill_payload): kv_b is not run here.
  const bool own_kv = W_ == 3 * H_;
  if (q_latent.defined()) q_up_.forward(q, q_latent, env_.w(q_up_w_), Tensor());
  if (own_kv) kv_up_.forward(m.kv, kv_latent, env_.w(kv_up_w_), Tensor());
  // The core's heads (N,W,D) in fp32: q; [k_nope | k_pe] (k_pe in every head; W = H + 1: [0 |
  // k_pe]); [v | 0]; RoPE on the last Dr dims of the queries and keys, rounded once, as
  // Attention's projection is.
  const Tensor work =
      qkv.dtype == DType::f32 ? qkv : head_of(env_.scratch.d_qkv, {env_.B, env_.T, W_, D_});
  const Tensor w2 = work.view({N, W_ * D_});
  if (Dv_ < D_ || !own_kv) ops::fill_zero(work);
  ops::copy_blocks(w2, q, {1, H_ * D_, 0, 0, 0, 0});
  if (own_kv) ops::copy_blocks(w2, m.kv, {H_, Dn_, H_ * D_, D_, 0, Dn_ + Dv_});
  ops::copy_blocks(w2, k_pe, {own_kv ? H_ : 1, Dr_, H_ * D_ + Dn_, D_, 0, 0});
  if (own_kv) ops::copy_blocks(w2, m.kv, {H_, Dv_, 2 * H_ * D_, D_, Dn_, Dn_ + Dv_});
  ops::rope_forward(work, own_kv ? 2 * H_ : H_ + 1, 0, cfg.rope_theta, env_.positions(), {Dn_, Dr_},
                    cfg.rope_scaling);
  if (work.data == qkv.data)
    env_.round(qkv);
  else
    ops::convert(qkv, work);
}

std::pair<Tensor, Tensor> LatentAttention::core(std::span<const Tensor> s) const {
  // (Keyed by the kv latent: under recompute_up every layer's qkv is the same scratch.)
  return attention_core(env_, recompute_core_, s, s[kv_latent_at()].data,
                        [&](Tensor out, Tensor lse) { run_core(out, lse, s); });
}

void LatentAttention::run_core(Tensor out, Tensor lse, std::span<const Tensor> s) const {
  const Tensor qkv = qkv_of(s);
  if (!payload_) return env_.attention.forward(out, lse, qkv);
  fill_payload(s);
  env_.attention.forward(out, lse, qkv, *this);
}

Tensor LatentAttention::payload_latent(Tensor p) const {
  const int64_t N = env_.tp.N;
  return p.rows(0, N * Ckv_).view({N, Ckv_});
}

Tensor LatentAttention::payload_kpe(Tensor p) const {
  const int64_t N = env_.tp.N;
  return p.rows(N * Ckv_, N * (Ckv_ + Dr_)).view({N, Dr_});
}

void LatentAttention::fill_payload(std::span<const Tensor> s) const {
  const Tensor p = env_.attention.payload();
  ops::copy(payload_latent(p), s[kv_latent_at()]);
  ops::copy_blocks(payload_kpe(p), qkv_of(s).view({env_.tp.N, W_ * D_}),
                   {1, Dr_, 0, 0, H_ * D_ + Dn_, 0});
}

Tensor LatentAttention::kv_up_heads(Tensor w, int64_t head0, int64_t h) const {
  return w.rows(head0 * (Dn_ + Dv_), (head0 + h) * (Dn_ + Dv_));
}

// As forward assembles a key and value head from kv_b's output and k_pe, rounded once: the
// payload's k_pe is rotated and rounded already (RoPE leaves the other dims alone), and a 16-bit
// kv rounds kv_b's output as it stores it, as forward's convert does. (h heads from head0: kv_b's
// rows of those heads.)
void LatentAttention::expand(Tensor kv, Tensor p, int64_t head0, int64_t h) const {
  const int64_t N = env_.tp.N, E = Dn_ + Dv_;
  const Tensor kvb = head_of(env_.scratch.mla.kv, {N, h * E});  // (N,h*(Dn+Dv)) f32
  kv_up_.forward(kvb, payload_latent(p), kv_up_heads(env_.w(kv_up_w_), head0, h), Tensor());
  const Tensor k2 = kv.view({N, 2 * h * D_});
  if (Dv_ < D_) ops::fill_zero(kv);
  ops::copy_blocks(k2, kvb, {h, Dn_, 0, D_, 0, E});
  ops::copy_blocks(k2, payload_kpe(p), {h, Dr_, Dn_, D_, 0, 0});
  ops::copy_blocks(k2, kvb, {h, Dv_, h * D_, D_, Dn_, E});
  if (kv.dtype == DType::f32) env_.round(kv);
}

// A block's dK/dV, rounded as backward_input rounds d_qkv: [d k_nope | d v] through kv_b into
// the latent's gradient (and kv_b's weight gradient, from the block's latent), the keys' RoPE
// dims summed over the heads into k_pe's (still rotated: backward_input un-rotates the sum).
void LatentAttention::contract(Tensor d_p, Tensor dkv, Tensor p, int64_t head0, int64_t h) const {
  const BlockScratch::Mla& m = env_.scratch.mla;
  const int64_t N = env_.tp.N, E = Dn_ + Dv_;
  env_.round(dkv);
  const Tensor d2 = dkv.view({N, 2 * h * D_}), dkvb = head_of(m.kv, {N, h * E});
  ops::copy_blocks(dkvb, d2, {h, Dn_, 0, E, 0, D_});
  ops::copy_blocks(dkvb, d2, {h, Dv_, Dn_, E, h * D_, D_});
  const Tensor d_lat = head_of(m.d_lat, {N, Ckv_});
  kv_up_.partial_input_grad(d_lat, dkvb, kv_up_heads(env_.w(kv_up_w_), head0, h));
  kv_up_.backward_weight(kv_up_heads(env_.g(kv_up_w_), head0, h), Tensor(), dkvb,
                         payload_latent(p));
  ops::add_inplace(payload_latent(d_p), d_lat);
  ops::copy_blocks(payload_kpe(d_p), d2, {h, Dr_, 0, 0, Dn_, D_}, /*add=*/true);
}

Tensor LatentAttention::forward(std::span<const Tensor> s, Tensor x) {
  const auto& cfg = env_.spec.cfg;
  BlockScratch::Mla& m = env_.scratch.mla;
  const int64_t N = env_.tp.N, R = env_.tp.R;
  const bool sp = env_.tp.sp();
  const DType ops_t = env_.tp.compute;
  Communicator* tp = env_.tp.tp.comm;
  // A latent (R,W): normalised into `full` (N,W) directly, or under SP into this rank's rows and
  // gathered over tp.
  auto latent = [&](Tensor full, Tensor rstd, Tensor in, int64_t w_index) {
    const int64_t W = in.size(1);
    Tensor rows = sp ? head_of(m.rows, {R, W}) : full;
    ops::rmsnorm_forward(rows, rstd, in, env_.w(w_index), cfg.norm_eps);
    env_.round(rows);
    if (sp) tp::gather_from_sequence_forward(*tp, full, rows);
  };
  Tensor xr = x.view({R, cfg.d_model});
  // Queries (N,H*D), f32, in the backward's d_att scratch (free during a forward).
  Tensor q = head_of(env_.scratch.d_att, {N, H_ * D_});
  Tensor q_latent;
  size_t i = lat_;
  if (Cq_ > 0) {
    Tensor qa = s[i], q_rstd = s[i + 1];
    q_latent = s[i + 2];
    i += 3;
    ops::linear_forward(qa, xr, env_.w(q_a_), Tensor(), ops_t);
    env_.round(qa);
    latent(q_latent, q_rstd, qa, q_norm_);
  } else {
    q_up_.forward(q, q_up_.input(x), env_.w(q_up_w_), Tensor());
  }
  // Keys and values: kv_a's output split into c (saved) and k_pe (gathered: m.k_pe, or saved
  // under recompute_up).
  Tensor c = s[i], kv_rstd = s[i + 1], kv_latent = s[i + 2];
  ops::linear_forward(m.kva, xr, env_.w(kv_a_), Tensor(), ops_t);
  ops::copy_blocks(c, m.kva, {1, Ckv_, 0, 0, 0, 0});
  env_.round(c);
  const Tensor k_pe = recompute_up_ ? s[i + 3] : m.k_pe;
  Tensor kpe_rows = sp ? head_of(m.rows, {R, Dr_}) : k_pe;
  ops::copy_blocks(kpe_rows, m.kva, {1, Dr_, 0, 0, Ckv_, 0});
  env_.round(kpe_rows);
  if (sp) tp::gather_from_sequence_forward(*tp, k_pe, kpe_rows);
  latent(kv_latent, kv_rstd, c, kv_norm_);
  const Tensor qkv = recompute_up_ ? m.qkv : s[0];
  build_qkv(qkv, q, q_latent, kv_latent, k_pe);
  if (recompute_up_) m.qkv_of = kv_latent.data;
  if (recompute_core_) env_.scratch.core_of = nullptr;  // recomputed below from this qkv
  const auto [att, lse] = core(s);
  if (!recompute_core_) {
    run_core(att, lse, s);
    env_.round(att);
  }
  Tensor y = proj_.forward(values_of(att, env_.scratch.d_qkv), env_.w(proj_w_), Tensor());
  env_.round(y);
  return y;
}

Tensor LatentAttention::backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) {
  const auto& cfg = env_.spec.cfg;
  const BlockScratch& sc = env_.scratch;
  const BlockScratch::Mla& m = sc.mla;
  const int64_t N = env_.tp.N, R = env_.tp.R;
  const bool sp = env_.tp.sp();
  const DType ops_t = env_.tp.compute;
  // (Rebuilt first, under recompute_up: it uses d_att and d_qkv.)
  const Tensor qkv = qkv_of(s);
  const auto [att, lse] = core(s);
  // The output's gradient (N,H*Dv), zero-padded to the core's heads in d_att.
  const Tensor d_o = Dv_ == D_ ? sc.d_att.view({N, H_ * Dv_}) : head_of(m.kv, {N, H_ * Dv_});
  st.keep(0, proj_.backward_input(d_o, dy, env_.w(proj_w_)));
  env_.round(d_o);
  if (Dv_ < D_) {
    ops::fill_zero(sc.d_att);
    ops::copy_blocks(sc.d_att.view({N, H_ * D_}), d_o, {H_, Dv_, 0, D_, 0, Dv_});
  }
  // The payload core returns the payload's gradient (kv_b's weight gradient added on the way)
  // and leaves dqkv's K/V heads zero.
  Tensor d_payload;
  if (payload_) {
    fill_payload(s);
    d_payload = env_.attention.backward(sc.d_qkv, sc.d_att, qkv, att, lse, *this);
  } else {
    env_.attention.backward(sc.d_qkv, sc.d_att, qkv, att, lse);
  }
  ops::rope_backward(sc.d_qkv, payload_ ? H_ : 2 * H_, 0, cfg.rope_theta, env_.positions(),
                     {Dn_, Dr_}, cfg.rope_scaling);
  env_.round(sc.d_qkv);
  // Back to the projections: d q (N,H*D); d kv = [d k_nope | d v] (N,H*(Dn+Dv)); d k_pe (N,Dr)
  // the sum over this rank's heads (from the payload: un-rotated here, after the sum).
  const Tensor dqkv = sc.d_qkv.view({N, 3 * H_ * D_});
  const Tensor dq = head_of(sc.d_att, {N, H_ * D_});
  ops::copy_blocks(dq, dqkv, {1, H_ * D_, 0, 0, 0, 0});
  if (payload_) {
    ops::copy(m.d_kpe, payload_kpe(d_payload));
    ops::rope_backward(m.d_kpe.view({env_.B, env_.T, 1, Dr_}), 1, 0, cfg.rope_theta,
                       env_.positions(), {}, cfg.rope_scaling);
  } else {
    ops::copy_blocks(m.kv, dqkv, {H_, Dn_, 0, Dn_ + Dv_, H_ * D_, D_});
    ops::copy_blocks(m.kv, dqkv, {H_, Dv_, Dn_, Dn_ + Dv_, 2 * H_ * D_, D_});
    ops::fill_zero(m.d_kpe);
    ops::copy_blocks(m.d_kpe, dqkv, {H_, Dr_, 0, 0, H_ * D_ + Dn_, D_}, /*add=*/true);
    st.keep(2, m.kv);
  }
  st.keep(1, dq);
  // The latents' gradients, summed over tp onto this rank's rows, through their norms.
  Tensor norms = st[st_norms()];
  ops::fill_zero(norms);
  const Tensor d_cn =
      payload_ ? kv_up_.reduce_input_grad(payload_latent(d_payload), head_of(m.d_rows, {R, Ckv_}))
               : kv_up_.backward_input(head_of(m.d_lat, {N, Ckv_}), m.kv, env_.w(kv_up_w_),
                                       head_of(m.d_rows, {R, Ckv_}));
  const Tensor dc = head_of(m.kva, {R, Ckv_});
  ops::rmsnorm_backward(dc, norms.rows(Cq_, Cq_ + Ckv_), d_cn, s[lat_ + (Cq_ > 0 ? 3 : 0)],
                        env_.w(kv_norm_), s[lat_ + (Cq_ > 0 ? 4 : 1)]);
  env_.round(dc);
  ops::copy_blocks(m.d_kva, dc, {1, Ckv_, 0, 0, 0, 0});
  Tensor d_kpe = m.d_kpe;
  if (sp) {
    d_kpe = head_of(m.d_rows, {R, Dr_});
    tp::gather_from_sequence_backward(*env_.tp.tp.comm, d_kpe, m.d_kpe);
  }
  env_.round(d_kpe);
  ops::copy_blocks(m.d_kva, d_kpe, {1, Dr_, Ckv_, 0, 0, 0});
  st.keep(3, m.d_kva);
  ops::linear_backward(m.dx, Tensor(), Tensor(), m.d_kva, Tensor(), env_.w(kv_a_), ops_t);
  // The queries' part of the input gradient.
  Tensor dx_q;
  if (Cq_ > 0) {
    const Tensor d_qn = q_up_.backward_input(head_of(m.d_lat, {N, Cq_}), dq, env_.w(q_up_w_),
                                             head_of(m.d_rows, {R, Cq_}));
    ops::rmsnorm_backward(m.d_qa, norms.rows(0, Cq_), d_qn, s[lat_], env_.w(q_norm_), s[lat_ + 1]);
    env_.round(m.d_qa);
    st.keep(4, m.d_qa);
    dx_q = head_of(sc.d_c, {R, cfg.d_model});
    ops::linear_backward(dx_q, Tensor(), Tensor(), m.d_qa, Tensor(), env_.w(q_a_), ops_t);
  } else {
    dx_q = q_up_.backward_input(sc.d_c, dq, env_.w(q_up_w_));
  }
  ops::add_inplace(m.dx, dx_q.view({R, cfg.d_model}));
  env_.round(m.dx);
  return m.dx;
}

void LatentAttention::backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  const DType ops_t = env_.tp.compute;
  const Tensor att = core(s).first;
  proj_.backward_weight(env_.g(proj_w_), Tensor(), st[0], values_of(att, env_.scratch.d_qkv));
  const Tensor xr = x.view({R, C});
  if (Cq_ > 0) {
    q_up_.backward_weight(env_.g(q_up_w_), Tensor(), st[1], s[lat_ + 2]);
    ops::linear_backward(Tensor(), env_.g(q_a_), Tensor(), st[4], xr, Tensor(), ops_t);
  } else {
    q_up_.backward_weight(env_.g(q_up_w_), Tensor(), st[1], q_up_.input(x));
  }
  // (The payload core added kv_b's weight gradient block by block in backward_input.)
  if (!payload_) kv_up_.backward_weight(env_.g(kv_up_w_), Tensor(), st[2], s[kv_latent_at()]);
  ops::linear_backward(Tensor(), env_.g(kv_a_), Tensor(), st[3], xr, Tensor(), ops_t);
  const Tensor norms = st[st_norms()];
  if (Cq_ > 0) ops::add_inplace(env_.g(q_norm_), norms.rows(0, Cq_));
  ops::add_inplace(env_.g(kv_norm_), norms.rows(Cq_, Cq_ + Ckv_));
}

// ---- Mlp ----------------------------------------------------------------------------------------

Mlp::Mlp(const BlockEnv& env, const std::string& prefix, int64_t ffn, bool recompute_act)
    : env_(env),
      recompute_act_(recompute_act),
      gelu_(env.spec.cfg.activation == Activation::gelu),
      F_((ffn > 0 ? ffn : env.spec.ffn_dim) / env.tp.tp.size()),
      F1_(gelu_ ? F_ : 2 * F_),
      fc1_w_(env.param(prefix + ".fc1.weight")),
      fc1_b_(env.param_opt(prefix + ".fc1.bias")),
      fc2_w_(env.param(prefix + ".fc2.weight")),
      fc2_b_(env.param_opt(prefix + ".fc2.bias")),
      fc1_(env.tp, true),
      fc2_(env.tp, true) {}

std::vector<TensorSpec> Mlp::saved() const {
  const DType t = env_.tp.compute;
  if (recompute_act_) return {{"u", {env_.B, env_.T, F1_}, false, t}};
  return {{"u", {env_.B, env_.T, F1_}, false, t}, {"g", {env_.B, env_.T, F_}, false, t}};
}

std::vector<TensorSpec> Mlp::stash() const {
  const int64_t N = env_.tp.N;
  return {{"d_fc2_out", {N, env_.spec.cfg.d_model}, true}, {"d_fc1_out", {N, F1_}, true}};
}

void Mlp::activate(Tensor g, Tensor u) const {
  const int64_t N = env_.tp.N;
  if (gelu_)
    ops::gelu_forward(g, u);
  else
    ops::swiglu_forward(g.view({N, F_}), u.view({N, F1_}));
  env_.round(g);
}

Tensor Mlp::activation(std::span<const Tensor> s) const {
  if (!recompute_act_) return s[1];
  BlockScratch& sc = env_.scratch;
  const Tensor g = head_of(sc.act_out, {env_.B, env_.T, F_});
  if (sc.act_of != s[0].data) {
    activate(g, s[0]);
    sc.act_of = s[0].data;
  }
  return g;
}

Tensor Mlp::forward(std::span<const Tensor> s, Tensor x) {
  const int64_t N = env_.tp.N;
  Tensor u = s[0];
  fc1_.forward(u.view({N, F1_}), fc1_.input(x), env_.w(fc1_w_), env_.w(fc1_b_));
  env_.round(u);
  const Tensor g = recompute_act_ ? head_of(env_.scratch.act_out, {env_.B, env_.T, F_}) : s[1];
  activate(g, u);
  if (recompute_act_) env_.scratch.act_of = u.data;
  Tensor y = fc2_.forward(g.view({N, F_}), env_.w(fc2_w_), env_.w(fc2_b_));
  env_.round(y);
  return y;
}

Tensor Mlp::backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) {
  const BlockScratch& sc = env_.scratch;
  const int64_t N = env_.tp.N;
  const Tensor d_g = head_of(sc.d_g, {N, F_}), d_u = head_of(sc.d_u, {N, F1_});
  st.keep(0, fc2_.backward_input(d_g, dy, env_.w(fc2_w_)));
  env_.round(d_g);
  if (gelu_)
    ops::gelu_backward(d_u, d_g, s[0].view({N, F1_}));
  else
    ops::swiglu_backward(d_u, d_g, s[0].view({N, F1_}));
  env_.round(d_u);
  Tensor du = st.keep(1, d_u);
  // fc1's input gradient; under SP its weight gradient gathers the input (N,C) once more
  // (Megatron's trade: R rows of memory per layer, not N, for one all-gather).
  return fc1_.backward_input(sc.d_c, du, env_.w(fc1_w_));
}

void Mlp::backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) {
  const int64_t N = env_.tp.N;
  fc2_.backward_weight(env_.g(fc2_w_), env_.g(fc2_b_), st[0], activation(s).view({N, F_}));
  fc1_.backward_weight(env_.g(fc1_w_), env_.g(fc1_b_), st[1], fc1_.input(x));
}

// ---- MoeMlp -------------------------------------------------------------------------------------

MoeRows moe_rows(const TpLayers& tp, int64_t T) {
  MoeRows r;
  r.R = tp.R;
  r.row0 = tp.row0;
  r.T = T;
  r.seg = std::gcd(tp.R, T);
  r.segments = tp.R / r.seg;
  return r;
}

MoeMlp::MoeMlp(const BlockEnv& env, const std::string& prefix, int64_t layer, bool recomputed,
               bool recompute_act, bool recompute_moe_act)
    : env_(env),
      cfg_(env.spec.cfg.moe),
      rows_(moe_rows(env.tp, env.T)),
      layer_(layer),
      recomputed_(recomputed),
      recompute_moe_act_(recompute_moe_act),
      E_(cfg_.num_experts),
      k_(cfg_.top_k),
      Fe_(cfg_.d_ff_expert),
      Fe1_(env.spec.expert_fc1_out),
      capacity_(moe_capacity(cfg_, env.seq.T)),  // of the whole sequence (cp: env.T is a share)
      gelu_(env.spec.cfg.activation == Activation::gelu),
      router_w_(env.param(prefix + ".router.weight")),
      bias_(env.param_opt(prefix + ".router.expert_bias")),
      fc1_w_(env.param(prefix + ".experts.fc1.weight")),
      fc2_w_(env.param(prefix + ".experts.fc2.weight")) {
  LLMT_CHECK(env.tp.tp.size() == 1 || env.tp.sp(),
             "a mixture-of-experts layer under tp needs sequence parallelism");
  LLMT_CHECK(!recompute_moe_act || ep() || env.scratch.moe_act_out.defined(), "layer ", layer,
             ": recomputing the routed experts' activation needs the model's scratch for it");
  if (cfg_.shared_experts > 0) {
    shared_.emplace(env, prefix + ".shared", env.spec.shared_ffn, recompute_act);
    st_shared_ = shared_->stash().size();
  }
}

std::vector<TensorSpec> ep_rows_specs(const ModelSpec& spec, int64_t R, DType compute,
                                      bool keep_act) {
  const int64_t C = spec.cfg.d_model, Fe1 = spec.expert_fc1_out;
  std::vector<TensorSpec> out{{"xr", {R, C}, false, compute}, {"hr", {R, Fe1}, false, compute}};
  if (keep_act) out.push_back(ep_act_specs(spec, R, compute)[0]);
  out.push_back({"er", {R, C}, false, compute});
  return out;
}

std::vector<TensorSpec> ep_act_specs(const ModelSpec& spec, int64_t R, DType compute) {
  return {{"gr", {R, spec.cfg.moe.d_ff_expert}, false, compute}};
}

std::vector<TensorSpec> ep_fp8_specs(const ModelSpec& spec, int64_t R, const Fp8Recipe& fp8) {
  if (!fp8.on()) return {};
  const int64_t W = std::max({spec.cfg.d_model, spec.expert_fc1_out, spec.cfg.moe.d_ff_expert});
  return {{"fp8_a", {R * W}}, {"fp8_b", {R * W}}, {"fp8_amax", {fp8_amax_size(fp8, R, W)}}};
}

std::vector<TensorSpec> ep_grad_specs(const ModelSpec& spec, int64_t R) {
  return {{"d_er", {R, spec.cfg.d_model}}, {"dh_r", {R, spec.expert_fc1_out}}};
}

int64_t ep_count_bytes(const ModelSpec& spec) {
  return 2 * spec.cfg.moe.num_experts * 4;
}

std::vector<TensorSpec> ep_backward_specs(const ModelSpec& spec, int64_t R) {
  return {{"dgr", {R, spec.cfg.moe.d_ff_expert}}, {"dxr", {R, spec.cfg.d_model}}};
}

std::vector<TensorSpec> MoeMlp::saved() const {
  const int64_t N = rows_.R, M = N * k_, C = env_.spec.cfg.d_model;
  const int64_t Mh = ep() ? 0 : M;  // under ep the experts' activations are EpRows'
  const int64_t Mg = recompute_moe_act_ ? 0 : Mh;
  // The routed rows, the experts' fc1 outputs, activations and outputs in the compute type (each
  // written by one op, which rounds it once); the router's tensors f32.
  const DType t = env_.tp.compute;
  std::vector<TensorSpec> out{{"logits", {N, E_}},         {"idx", {N, k_}},
                              {"weights", {N, k_}},        {"counts", {rows_.segments, E_}},
                              {"offsets", {E_ + 1}},       {"assign", {M}},
                              {"slot", {N, k_}},           {"xp", {M, C}, false, t},
                              {"h", {Mh, Fe1_}, false, t}, {"g", {Mg, Fe_}, false, t},
                              {"eo", {M, C}, false, t}};
  if (shared_)
    for (const TensorSpec& t : shared_->saved()) out.push_back(t);
  return out;
}

std::vector<TensorSpec> MoeMlp::stash() const {
  const int64_t N = rows_.R, M = N * k_, C = env_.spec.cfg.d_model;
  std::vector<TensorSpec> out{
      {"d_logits", {N, E_}}, {"d_eo", {M, C}}, {"d_h", {ep() ? 0 : M, Fe1_}}};
  if (shared_)
    for (const TensorSpec& t : shared_->stash()) out.push_back(t);
  return out;
}

std::vector<int64_t> MoeMlp::offsets(std::span<const Tensor> s) const {
  if (ops::Recording::active()) {
    // A step run to count the ops' bytes (plan): no router ran; balanced routing, every
    // assignment kept, as the cost model assumes.
    std::vector<int64_t> off(static_cast<size_t>(E_ + 1));
    for (int64_t e = 0; e <= E_; ++e) off[static_cast<size_t>(e)] = rows_.R * k_ * e / E_;
    return off;
  }
  std::vector<int32_t> host(static_cast<size_t>(E_ + 1));
  env_.alloc.backend().copy_to_host(host.data(), s[4].data, host.size() * 4);
  return {host.begin(), host.end()};
}

MoeMlp::EpRows MoeMlp::ep_dispatch(std::span<const Tensor> s, const std::vector<int64_t>& off,
                                   bool count) {
  Communicator& ep = *env_.ep;
  const int P = ep.size();
  const int64_t C = env_.spec.cfg.d_model, El = E_ / P;
  // Rows per (peer, local expert) to send, then the same counts from each peer for this rank's
  // experts: one all-to-all of P x El counts.
  std::vector<int32_t> cnt(static_cast<size_t>(P * El)), got(cnt.size());
  for (int64_t g = 0; g < P * El; ++g)
    cnt[static_cast<size_t>(g)] = static_cast<int32_t>(off[g + 1] - off[g]);
  Buffer cbuf =
      env_.alloc.allocate(static_cast<size_t>(ep_count_bytes(env_.spec)), MemCategory::comm);
  const Tensor cin = cbuf.tensor({P * El}, DType::i32),
               cout = cbuf.tensor({P * El}, DType::i32, cnt.size() * 4);
  env_.alloc.backend().copy_from_host(cin.data, cnt.data(), cnt.size() * 4);
  ep.all_to_all(cout, cin).wait();
  env_.alloc.backend().copy_to_host(got.data(), cout.data, got.size() * 4);
  if (ops::Recording::active()) got = cnt;  // (plan's op count: balanced, each peer sends as many)
  EpRows r;
  r.groups.assign(1, 0);
  for (int p = 0; p < P; ++p) {
    int64_t sent = 0, recv = 0;
    for (int64_t e = 0; e < El; ++e) {
      sent += cnt[static_cast<size_t>(p * El + e)];
      recv += got[static_cast<size_t>(p * El + e)];
      r.groups.push_back(r.groups.back() + got[static_cast<size_t>(p * El + e)]);
      r.weight_of.push_back(e);
    }
    r.send.push_back(sent * C);
    r.recv.push_back(recv * C);
  }
  if (count)
    for (int p = 0; p < P; ++p)
      if (p != ep.rank())
        env_.moe_stats.ep_rows +=
            (r.send[static_cast<size_t>(p)] + r.recv[static_cast<size_t>(p)]) / C;
  const int64_t R = r.groups.back();
  const std::vector<Tensor> t =
      allocate_specs(env_.alloc, ep_rows_specs(env_.spec, R, env_.tp.compute, !recompute_moe_act_),
                     MemCategory::activations, r.buf);
  r.xr = t[0];
  r.hr = t[1];
  if (!recompute_moe_act_) r.gr = t[2];
  r.er = t.back();
  // The rows to the experts' ranks and the experts' first GEMM (and activation).
  ep.all_to_allv(r.xr, r.recv, s[7], r.send).wait();
  Buffer fp8_buf;
  const Fp8Scratch q = fp8_scratch(R, fp8_buf);
  experts_forward(r.hr, r.xr, fc1_w_, r.groups, r.weight_of, q);
  env_.round(r.hr);
  if (!recompute_moe_act_) activate(r.gr, r.hr);
  return r;
}

void MoeMlp::activate(Tensor g, Tensor h) const {
  if (gelu_)
    ops::gelu_forward(g, h);
  else
    ops::swiglu_forward(g, h);
  env_.round(g);
}

Tensor MoeMlp::ep_activation(const EpRows& r, Buffer& buf) const {
  if (r.gr.defined()) return r.gr;
  const Tensor g =
      allocate_specs(env_.alloc, ep_act_specs(env_.spec, r.hr.size(0), env_.tp.compute),
                     MemCategory::activations, buf)[0];
  activate(g, r.hr);
  return g;
}

void MoeMlp::ep_forward(std::span<const Tensor> s, const std::vector<int64_t>& off) {
  Communicator& ep = *env_.ep;
  const Tensor eo = s[10];
  const bool replaying = env_.moe_stats.replaying;
  if (replaying) {
    // A full-recompute replay of a micro-batch whose experts already ran (and whose gradients
    // may be under way): their outputs come back again; nothing else is redone.
    auto it = ep_rows_.find(env_.scratch.layer_input);
    if (it != ep_rows_.end()) {
      ep.all_to_allv(eo, it->second.send, it->second.er, it->second.recv).wait();
      return;
    }
  }
  EpRows r = ep_dispatch(s, off, /*count=*/!replaying);
  {
    Buffer act_buf, fp8_buf;
    const Tensor gr = ep_activation(r, act_buf);
    const Fp8Scratch q = fp8_scratch(r.xr.size(0), fp8_buf);
    experts_forward(r.er, gr, fc2_w_, r.groups, r.weight_of, q);
  }
  env_.round(r.er);
  ep.all_to_allv(eo, r.send, r.er, r.recv).wait();
  // Kept for the backward, but not from the first forward of an evaluation or of a fully
  // recomputed layer: its backward dispatches them again (the replay, or backward_input when
  // the replay set still holds the layer), so no micro-batch in flight holds them.
  if (env_.moe_stats.forward_only || (recomputed_ && !replaying)) {
    ep_rows_.erase(env_.scratch.layer_input);
    return;
  }
  ep_rows_[env_.scratch.layer_input] = std::move(r);
}

Tensor MoeMlp::rank_base(Tensor idx, Buffer& buf) const {
  // This rank's tokens as runs of L positions, each inside one sequence and one cp chunk: L
  // divides the segment and the chunk (2 chunks of the cp-local T per cp rank, or T itself).
  const SequenceShard& sh = env_.seq;
  const int64_t seg = rows_.seg, S = rows_.segments;
  const int64_t L = std::gcd(seg, sh.runs.front().len), H = seg / L, chunks = sh.T / L;
  const std::vector<int32_t> pos = sh.positions();    // cp-local index -> global position
  const auto first_pos = [&](int64_t i, int64_t h) {  // of segment i's run h
    return pos[static_cast<size_t>((rows_.row0 + i * seg + h * L) % rows_.T)];
  };
  std::vector<int32_t> ix(static_cast<size_t>(rows_.R * k_));
  env_.alloc.backend().copy_to_host(ix.data(), idx.data, ix.size() * 4);
  // (B,E,k,chunks): this rank's runs' counts, then (summed over tp and cp) every chunk's.
  std::vector<int32_t> cnt(static_cast<size_t>(env_.B * E_ * k_ * chunks), 0);
  const auto at = [&](int64_t b, int64_t e, int64_t j, int64_t c) {
    return static_cast<size_t>(((b * E_ + e) * k_ + j) * chunks + c);
  };
  for (int64_t i = 0; i < S; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = i * seg + h * L; t < i * seg + (h + 1) * L; ++t)
        for (int64_t j = 0; j < k_; ++j)
          ++cnt[at(rows_.sequence(i), ix[static_cast<size_t>(t * k_ + j)], j, first_pos(i, h) / L)];
  const Tensor all(cnt.data(), {static_cast<int64_t>(cnt.size())}, DType::i32);
  if (env_.tp.sp()) env_.tp.tp.comm->all_reduce(all).wait();
  if (env_.cp != nullptr) env_.cp->all_reduce(all).wait();
  // Ranked by (j, position): every earlier choice's assignments, then the earlier chunks'.
  std::vector<int32_t> base(static_cast<size_t>(S * E_ * k_ * H));
  for (int64_t i = 0; i < S; ++i)
    for (int64_t e = 0; e < E_; ++e) {
      const int64_t b = rows_.sequence(i);
      int64_t before = 0;  // the sequence's assignments to e at choices < j
      for (int64_t j = 0; j < k_; ++j) {
        for (int64_t h = 0; h < H; ++h) {
          int64_t r = before;
          for (int64_t c = 0; c < first_pos(i, h) / L; ++c) r += cnt[at(b, e, j, c)];
          base[static_cast<size_t>(((i * E_ + e) * k_ + j) * H + h)] = static_cast<int32_t>(r);
        }
        for (int64_t c = 0; c < chunks; ++c) before += cnt[at(b, e, j, c)];
      }
    }
  buf = env_.alloc.allocate(base.size() * 4, MemCategory::other);
  env_.alloc.backend().copy_from_host(buf.data(), base.data(), base.size() * 4);
  return buf.tensor({S, E_, k_, H}, DType::i32);
}

void MoeMlp::sequence_counts(Tensor counts, const std::vector<int32_t>& local) const {
  if (!env_.tp.sp()) {  // whole sequences: the segments are the micro-batch's sequences
    env_.cp->all_reduce(counts).wait();
    return;
  }
  std::vector<int32_t> seq(static_cast<size_t>(env_.B * E_), 0);
  for (int64_t i = 0; i < rows_.segments; ++i)
    for (int64_t e = 0; e < E_; ++e)
      seq[static_cast<size_t>(rows_.sequence(i) * E_ + e)] +=
          local[static_cast<size_t>(i * E_ + e)];
  const Tensor all(seq.data(), {env_.B * E_}, DType::i32);
  env_.tp.tp.comm->all_reduce(all).wait();
  if (env_.cp != nullptr) env_.cp->all_reduce(all).wait();
  std::vector<int32_t> out(local.size());
  for (int64_t i = 0; i < rows_.segments; ++i)
    std::copy_n(seq.begin() + rows_.sequence(i) * E_, E_, out.begin() + i * E_);
  env_.alloc.backend().copy_from_host(counts.data, out.data(), out.size() * 4);
}

namespace {

// The router's settings (model.moe).
ops::MoeRouting routing(const MoeConfig& c) {
  return {.sigmoid = c.router == MoeRouter::sigmoid,
          .normalize = c.normalize,
          .groups = c.n_group,
          .topk_group = c.groups_picked(),
          .scale = c.routed_scaling_factor};
}

}  // namespace

Tensor MoeMlp::forward(std::span<const Tensor> s, Tensor x) {
  const BlockScratch& sc = env_.scratch;
  const int64_t N = rows_.R, C = env_.spec.cfg.d_model, S = rows_.segments;
  const bool sigmoid = cfg_.router == MoeRouter::sigmoid;
  const Tensor logits = s[0], idx = as_i32(s[1]), weights = s[2], counts = as_i32(s[3]);
  const Tensor assign = as_i32(s[5]), slot = as_i32(s[6]);
  const Tensor xp = s[7], h = s[8], g = s[9], eo = s[10];
  x = x.view({N, C});
  // The router in fp32 (its logits are not rounded to the compute type).
  ops::linear_forward(logits, x, env_.w(router_w_), Tensor());
  ops::moe_route(sc.moe_scores, idx, weights, logits, routing(cfg_), env_.w(bias_));
  Buffer base_buf;
  const Tensor base =
      capacity_ > 0 && (env_.cp != nullptr || env_.tp.sp()) ? rank_base(idx, base_buf) : Tensor();
  ops::moe_dispatch(counts, as_i32(s[4]), assign, slot, idx, rows_.seg, capacity_, base);
  MoeStats& st = env_.moe_stats;
  std::vector<int32_t> cnt(static_cast<size_t>(S * E_));  // this rank's counts (the loads)
  const bool shared_sequences = env_.cp != nullptr || env_.tp.sp();
  if (!st.replaying || shared_sequences)
    env_.alloc.backend().copy_to_host(cnt.data(), counts.data, cnt.size() * 4);
  // Context and tensor parallelism: the whole sequences' counts, for the aux loss and its
  // gradient.
  if (shared_sequences) sequence_counts(counts, cnt);
  const std::vector<int64_t> off = offsets(s);
  const int64_t M = off.back();  // the kept assignments
  ops::moe_permute(xp, x, assign);
  if (ep()) {
    ep_forward(s, off);
  } else {
    Buffer none;
    const Fp8Scratch q = fp8_scratch(M, none);
    experts_forward(h, xp, fc1_w_, off, {}, q);
    env_.round(h.rows(0, M));
    const Tensor ga = recompute_moe_act_ ? head_of(sc.moe_act_out, {h.size(0), Fe_}) : g;
    activate(ga.rows(0, M), h.rows(0, M));
    if (recompute_moe_act_) env_.scratch.moe_act_of = h.data;
    experts_forward(eo, ga, fc2_w_, off, {}, q);
    env_.round(eo.rows(0, M));
  }
  const Tensor y = sc.moe_y;
  ops::moe_unpermute(y, eo, slot, weights);
  if (shared_) ops::add_inplace(y, shared_->forward(s.subspan(kSaved), x));
  env_.round(y);

  if (st.replaying) return y;  // a full-recompute replay: counted when it first ran
  ops::moe_route_losses(sc.moe_aux, sc.moe_zsq, logits, counts, k_, sigmoid);
  std::vector<float> aux(static_cast<size_t>(S)), zsq(static_cast<size_t>(N));
  env_.alloc.backend().copy_to_host(aux.data(), sc.moe_aux.data, aux.size() * 4);
  env_.alloc.backend().copy_to_host(zsq.data(), sc.moe_zsq.data, zsq.size() * 4);
  // This rank's share of the micro-batch's losses. A segment's aux from the kernel is its
  // sequence's counts over the segment's length times the segment's mean of q: (T / seg)^2
  // times its share of the sequence's aux (T the whole sequence's length; under cp and tp the
  // shares of the ranks add up to the sequence's). The z-loss is a mean over the tokens of the
  // micro-batch's sequences (N of them per cp rank).
  const double cp = env_.cp != nullptr ? env_.cp->size() : 1;
  const double part = static_cast<double>(rows_.seg) / static_cast<double>(env_.seq.T);
  if (cfg_.balance == MoeBalance::aux_loss)
    st.aux += cfg_.aux_loss_coef * std::accumulate(aux.begin(), aux.end(), 0.0) * part * part /
              static_cast<double>(env_.B);
  st.z += cfg_.z_loss_coef * std::accumulate(zsq.begin(), zsq.end(), 0.0) /
          (static_cast<double>(env_.tp.N) * cp);
  std::vector<int64_t>& load = st.load.at(static_cast<size_t>(layer_));
  load.resize(static_cast<size_t>(E_), 0);
  for (int64_t i = 0; i < S * E_; ++i)
    load[static_cast<size_t>(i % E_)] += cnt[static_cast<size_t>(i)];
  st.assigned += N * k_;
  st.dropped += N * k_ - M;
  return y;
}

Tensor MoeMlp::backward_input(std::span<const Tensor> s, Stash& st, Tensor dy) {
  const BlockScratch& sc = env_.scratch;
  const int64_t N = rows_.R, C = env_.spec.cfg.d_model;
  const Tensor logits = s[0], idx = as_i32(s[1]), weights = s[2], counts = as_i32(s[3]);
  const Tensor assign = as_i32(s[5]), slot = as_i32(s[6]), h = s[8], eo = s[10];
  const Tensor d_logits = st[0], d_eo = st[1], d_h = st[2];
  dy = dy.view({N, C});
  const std::vector<int64_t> off = offsets(s);
  const int64_t M = off.back();
  // The combine: y = sum_j w_j eo_j.
  ops::moe_weights_backward(sc.moe_dw, dy, eo, slot);
  ops::moe_permute(d_eo, dy, assign, weights);
  env_.round(d_eo.rows(0, M));
  // fc2, the activation, fc1 (input gradients); under ep on the experts' ranks, the output
  // gradients sent there and the input gradients back.
  if (ep()) {
    auto it = ep_rows_.find(env_.scratch.layer_input);
    if (it == ep_rows_.end()) {
      // A fully recomputed layer whose backward did not replay it (the replay set still held
      // it): its rows are dispatched again here, as the replay would have.
      LLMT_CHECK(recomputed_, "MoE backward_input before its forward");
      it = ep_rows_.emplace(env_.scratch.layer_input, ep_dispatch(s, off, false)).first;
    }
    EpRows& r = it->second;
    const int64_t R = r.xr.size(0);
    Communicator& ep = *env_.ep;
    // The gradients the weight half reads, kept with the rows until backward_weight.
    const std::vector<Tensor> g = allocate_specs(env_.alloc, ep_grad_specs(env_.spec, R),
                                                 MemCategory::activations, r.grad_buf);
    r.d_er = g[0];
    r.dh_r = g[1];
    ep.all_to_allv(r.d_er, r.recv, d_eo, r.send).wait();
    Buffer tmp, fp8_buf;
    const std::vector<Tensor> t =
        allocate_specs(env_.alloc, ep_backward_specs(env_.spec, R), MemCategory::activations, tmp);
    const Tensor dgr = t[0], dxr = t[1];
    const Fp8Scratch q = fp8_scratch(R, fp8_buf);
    experts_backward_input(dgr, r.d_er, fc2_w_, r.groups, r.weight_of, q);
    env_.round(dgr);
    if (gelu_)
      ops::gelu_backward(r.dh_r, dgr, r.hr);
    else
      ops::swiglu_backward(r.dh_r, dgr, r.hr);
    env_.round(r.dh_r);
    experts_backward_input(dxr, r.dh_r, fc1_w_, r.groups, r.weight_of, q);
    ep.all_to_allv(sc.moe_dxp, r.send, dxr, r.recv).wait();
  } else {
    Buffer none;
    const Fp8Scratch q = fp8_scratch(M, none);
    experts_backward_input(sc.moe_dg, d_eo, fc2_w_, off, {}, q);
    env_.round(sc.moe_dg.rows(0, M));
    if (gelu_)
      ops::gelu_backward(d_h.rows(0, M), sc.moe_dg.rows(0, M), h.rows(0, M));
    else
      ops::swiglu_backward(d_h.rows(0, M), sc.moe_dg.rows(0, M), h.rows(0, M));
    env_.round(d_h.rows(0, M));
    experts_backward_input(sc.moe_dxp, d_h, fc1_w_, off, {}, q);
  }
  ops::moe_unpermute(sc.moe_dx, sc.moe_dxp, slot);
  // The router: through the routing weights, the aux loss and the z-loss (each scaled as the
  // micro-batch's loss is: dloss per unit of this cp rank's mean). The counts are the whole
  // sequences' (Tg = seq_len tokens): d aux / d q = E counts / (B k Tg Tg), times cp for dloss
  // being per unit of a chunk's mean; the z-loss's mean is over the cp rank's N tokens.
  const MoeStats& ms = env_.moe_stats;
  const double cp = env_.cp != nullptr ? env_.cp->size() : 1;
  const double Tg = static_cast<double>(env_.seq.T);
  const float aux_scale =
      cfg_.balance == MoeBalance::aux_loss
          ? static_cast<float>(static_cast<double>(ms.dloss) * cp * cfg_.aux_loss_coef * E_ /
                               (static_cast<double>(env_.B) * Tg * Tg * k_))
          : 0.0f;
  const float z_scale = static_cast<float>(static_cast<double>(ms.dloss) * cfg_.z_loss_coef * 2.0 /
                                           static_cast<double>(env_.tp.N));
  ops::moe_route_backward(d_logits, sc.moe_dw, logits, idx, counts, routing(cfg_), aux_scale,
                          z_scale);
  ops::linear_backward(sc.moe_dx_router, Tensor(), Tensor(), d_logits, Tensor(), env_.w(router_w_));
  ops::add_inplace(sc.moe_dx, sc.moe_dx_router);
  if (shared_) {
    Stash sst = st.part(kStash, st_shared_);
    ops::add_inplace(sc.moe_dx, shared_->backward_input(s.subspan(kSaved), sst, dy));
  }
  env_.round(sc.moe_dx);
  return sc.moe_dx;
}

void MoeMlp::backward_weight(std::span<const Tensor> s, const Stash& st, Tensor x) {
  const int64_t N = rows_.R, C = env_.spec.cfg.d_model;
  if (ep()) {
    auto it = ep_rows_.find(env_.scratch.layer_input);
    LLMT_CHECK(it != ep_rows_.end(), "MoE backward_weight before its forward");
    const EpRows& r = it->second;
    Buffer act_buf, fp8_buf;
    const Tensor gr = ep_activation(r, act_buf);
    const Fp8Scratch q = fp8_scratch(r.xr.size(0), fp8_buf);
    experts_backward_weight(fc2_w_, r.d_er, gr, r.groups, r.weight_of, q);
    experts_backward_weight(fc1_w_, r.dh_r, r.xr, r.groups, r.weight_of, q);
    ep_rows_.erase(it);
  } else {
    const std::vector<int64_t> off = offsets(s);
    const int64_t M = off.back();
    Tensor g = s[9];
    if (recompute_moe_act_) {
      BlockScratch& sc = env_.scratch;
      const Tensor h = s[8];
      g = head_of(sc.moe_act_out, {h.size(0), Fe_});
      if (sc.moe_act_of != h.data) {
        activate(g.rows(0, M), h.rows(0, M));
        sc.moe_act_of = h.data;
      }
    }
    Buffer none;
    const Fp8Scratch q = fp8_scratch(M, none);
    experts_backward_weight(fc2_w_, st[1], g, off, {}, q);
    experts_backward_weight(fc1_w_, st[2], s[7], off, {}, q);
  }
  ops::linear_backward(Tensor(), env_.g(router_w_), Tensor(), st[0], x.view({N, C}), Tensor());
  if (shared_) shared_->backward_weight(s.subspan(kSaved), st.part(kStash, st_shared_), x);
}

MoeMlp::Fp8Scratch MoeMlp::fp8_scratch(int64_t R, Buffer& buf) const {
  const TpLayers& t = env_.tp;
  if (!t.fp8.on()) return {};
  if (!ep()) return {t.fp8_a, t.fp8_b, t.fp8_amax};
  const std::vector<Tensor> q =
      allocate_specs(env_.alloc, ep_fp8_specs(env_.spec, R, t.fp8), MemCategory::activations, buf);
  return {q[0], q[1], q[2]};
}

void MoeMlp::experts_forward(Tensor out, Tensor in, int64_t w, std::span<const int64_t> groups,
                             std::span<const int64_t> weight_of, const Fp8Scratch& q) const {
  const TpLayers& t = env_.tp;
  if (!t.fp8.on())
    return ops::grouped_linear_forward(out, in, env_.w(w), groups, weight_of, t.compute);
  ops::grouped_linear_forward(
      out, fp8_quantized_groups(t.fp8, in, groups, Fp8Tiles::rows, false, q.a, q.amax),
      fp8_quantized_stack(t.fp8, env_.w(w), t.fp8_w, t.fp8_amax), groups, weight_of);
}

void MoeMlp::experts_backward_input(Tensor din, Tensor dout, int64_t w,
                                    std::span<const int64_t> groups,
                                    std::span<const int64_t> weight_of, const Fp8Scratch& q) const {
  const TpLayers& t = env_.tp;
  if (!t.fp8.on())
    return ops::grouped_linear_backward(din, Tensor(), dout, Tensor(), env_.w(w), groups, weight_of,
                                        t.compute);
  ops::grouped_linear_backward(
      din, Tensor(), fp8_quantized_groups(t.fp8, dout, groups, Fp8Tiles::rows, true, q.b, q.amax),
      Tensor(), fp8_quantized_stack(t.fp8, env_.w(w), t.fp8_w, t.fp8_amax), groups, weight_of);
}

void MoeMlp::experts_backward_weight(int64_t w, Tensor dout, Tensor in,
                                     std::span<const int64_t> groups,
                                     std::span<const int64_t> weight_of,
                                     const Fp8Scratch& q) const {
  const TpLayers& t = env_.tp;
  if (!t.fp8.on())
    return ops::grouped_linear_backward(Tensor(), env_.g(w), dout, in, Tensor(), groups, weight_of,
                                        t.compute);
  ops::grouped_linear_backward(
      Tensor(), env_.g(w),
      fp8_quantized_groups(t.fp8, dout, groups, Fp8Tiles::cols, true, q.b, q.amax),
      fp8_quantized_groups(t.fp8, in, groups, Fp8Tiles::cols, false, q.a, q.amax), Tensor(), groups,
      weight_of);
}

// ---- Layer --------------------------------------------------------------------------------------

namespace {

std::unique_ptr<Branch> make_attention(const BlockEnv& env, int64_t layer, LayerRecompute rc) {
  const std::string prefix = "layers." + std::to_string(layer) + ".attn";
  if (env.spec.cfg.mla_attention())
    return std::make_unique<LatentAttention>(env, prefix, rc.core(), rc.mla_up());
  return std::make_unique<Attention>(env, prefix, rc.core());
}

std::unique_ptr<Branch> make_mlp(const BlockEnv& env, int64_t layer, LayerRecompute rc) {
  const std::string prefix = "layers." + std::to_string(layer) + ".mlp";
  if (env.spec.cfg.moe.layer(layer))
    return std::make_unique<MoeMlp>(env, prefix, layer, rc.mode == Recompute::full, rc.act(),
                                    rc.moe_act());
  return std::make_unique<Mlp>(env, prefix, 0, rc.act());
}

}  // namespace

Layer::Layer(const BlockEnv& env, int64_t layer, LayerRecompute recompute, std::span<Tensor> replay,
             bool distributed)
    : env_(env),
      layer_(layer),
      recompute_(recompute),
      distributed_(distributed),
      replay_(replay),
      norm_1_(env, "layers." + std::to_string(layer) + ".norm_1"),
      norm_2_(env, "layers." + std::to_string(layer) + ".norm_2"),
      attn_block_(make_attention(env, layer, recompute)),
      mlp_block_(make_mlp(env, layer, recompute)) {
  // [res_in, a, res_mid, m], or without the norms' outputs [res_in, res_mid].
  mid_ = recompute_.norms() ? 1 : 2;
  n1_ = 2 * mid_;
  attn_ = n1_ + norm_1_.saved().size();
  n2_ = attn_ + attn_block_->saved().size();
  mlp_ = n2_ + norm_2_.saved().size();
  end_ = mlp_ + mlp_block_->saved().size();
  // The stash in backward order: mlp, norm_2, attention, norm_1.
  st_mlp_ = 0;
  st_n2_ = st_mlp_ + mlp_block_->stash().size();
  st_attn_ = st_n2_ + norm_2_.stash().size();
  st_n1_ = st_attn_ + attn_block_->stash().size();
  st_end_ = st_n1_ + norm_1_.stash().size();
  LLMT_CHECK(recompute_.mode != Recompute::full || replay_.size() == end_, "layer ", layer,
             ": the replay set has ", replay_.size(), " tensors, full recompute needs ", end_);
  LLMT_CHECK(!recompute_.norms() || env_.scratch.norm_out.defined(), "layer ", layer,
             ": recomputing the norms needs the model's norm scratch");
  LLMT_CHECK(!recompute_.act() || env_.scratch.act_out.defined(), "layer ", layer,
             ": recomputing the activation needs the model's activation scratch");
  LLMT_CHECK(!distributed_ || (recompute_.mode == Recompute::full && env_.tp.parallel() &&
                               !env_.tp.sp() && env_.scratch.whole[0].defined()),
             "layer ", layer, ": distributed saved inputs need full recompute under tp without ",
             "sequence parallelism, and the model's whole-input scratch");
}

std::vector<TensorSpec> Layer::full_saved() const {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  const DType t = env_.tp.compute;
  std::vector<TensorSpec> out{{"res_in", {R, C}, false, t},
                              {"a", {R, C}, false, t},
                              {"res_mid", {R, C}, false, t},
                              {"m", {R, C}, false, t}};
  if (recompute_.norms()) out = {out[0], out[2]};
  for (const auto& part :
       {norm_1_.saved(), attn_block_->saved(), norm_2_.saved(), mlp_block_->saved()})
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<TensorSpec> Layer::saved() const {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  if (distributed_) return {{"res_in", {R * C / env_.tp.tp.size()}, false, env_.tp.compute}};
  if (recompute_.mode == Recompute::full) return {{"res_in", {R, C}, false, env_.tp.compute}};
  return full_saved();
}

std::vector<TensorSpec> Layer::stash() const {
  std::vector<TensorSpec> out;
  for (const auto& part :
       {mlp_block_->stash(), norm_2_.stash(), attn_block_->stash(), norm_1_.stash()})
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

float Layer::dropout(const StepContext& ctx) const {
  return ctx.dropout ? env_.spec.cfg.dropout : 0.0f;
}

uint64_t Layer::dropout_stream(int site, int64_t step) const {
  return rng::mix64(rng::hash_name("dropout") ^
                    rng::mix64(static_cast<uint64_t>(layer_ * 2 + site)) ^
                    rng::mix64(static_cast<uint64_t>(step) + 0x51ed27ULL));
}

// out = res + dropout(branch); the mask is keyed by the global element index: (sample, global
// position, channel), whatever rows this rank holds (its rows start at row0 under sequence
// parallelism, and are two chunks of each sequence under context parallelism).
void Layer::residual(Tensor out, Tensor res, Tensor branch, int site, const StepContext& ctx) {
  const float p = dropout(ctx);
  if (p > 0.0f) {
    const int64_t C = env_.spec.cfg.d_model;
    const Tensor d_tmp = env_.scratch.d_tmp.view({env_.tp.R, C}), in = branch.view({env_.tp.R, C});
    env_.seq.for_each_run(
        ctx.first_sample, env_.tp.row0, env_.tp.R, [&](int64_t row, int64_t global_row, int64_t n) {
          ops::dropout_forward(d_tmp.rows(row, row + n), in.rows(row, row + n), p, ctx.seed,
                               dropout_stream(site, ctx.step), global_row * C);
        });
    branch = env_.scratch.d_tmp;
  }
  ops::add(out, res, branch);
  env_.round(out);
}

// The gradient of a residual branch's output (R,C): d_res through the dropout mask (or d_res);
// 16-bit, as it is the output gradient of a linear (the 1/(1-p) scaling leaves the grid).
Tensor Layer::branch_grad(int site, const StepContext& ctx) {
  const BlockScratch& sc = env_.scratch;
  const float p = dropout(ctx);
  if (p == 0.0f) return sc.d_res;
  const int64_t C = env_.spec.cfg.d_model;
  const Tensor d_tmp = sc.d_tmp.view({env_.tp.R, C}), d_res = sc.d_res.view({env_.tp.R, C});
  env_.seq.for_each_run(
      ctx.first_sample, env_.tp.row0, env_.tp.R, [&](int64_t row, int64_t global_row, int64_t n) {
        ops::dropout_backward(d_tmp.rows(row, row + n), d_res.rows(row, row + n), p, ctx.seed,
                              dropout_stream(site, ctx.step), global_row * C);
      });
  env_.round(sc.d_tmp);
  return sc.d_tmp;
}

Tensor Layer::normed(std::span<const Tensor> f, int site) const {
  if (!recompute_.norms()) return f[site == 0 ? 1 : 3];
  BlockScratch& sc = env_.scratch;
  const Tensor in = f[site == 0 ? 0 : mid_];
  if (sc.norm_of != in.data) {
    // The same op on the same input: the statistics it writes are the saved ones again.
    if (site == 0)
      norm_1_.forward(f.subspan(n1_, attn_ - n1_), sc.norm_out, in);
    else
      norm_2_.forward(f.subspan(n2_, mlp_ - n2_), sc.norm_out, in);
    sc.norm_of = in.data;
  }
  return sc.norm_out;
}

void Layer::run_forward(std::span<const Tensor> f, Tensor out, const StepContext& ctx) {
  BlockScratch& sc = env_.scratch;
  const bool kept = !recompute_.norms();
  const Tensor res_in = f[0], res_mid = f[mid_];
  const Tensor a = kept ? f[1] : sc.norm_out, m = kept ? f[3] : sc.norm_out;
  norm_1_.forward(f.subspan(n1_, attn_ - n1_), a, res_in);
  if (!kept) sc.norm_of = res_in.data;
  Tensor y = attn_block_->forward(f.subspan(attn_, n2_ - attn_), a);
  residual(res_mid, res_in, y, 0, ctx);
  norm_2_.forward(f.subspan(n2_, mlp_ - n2_), m, res_mid);
  if (!kept) sc.norm_of = res_mid.data;
  y = mlp_block_->forward(f.subspan(mlp_, end_ - mlp_), m);
  residual(out, res_mid, y, 1, ctx);
}

void Layer::forward(std::span<const Tensor> s, Tensor in, Tensor out, const StepContext& ctx) {
  LLMT_CHECK(distributed_ ? in.data != s[0].data && in.numel() == s[0].numel() * env_.tp.tp.size()
                          : in.data == s[0].data,
             "layer ", layer_, ": the forward's input must be ",
             distributed_ ? "the whole of its saved part" : "its saved res_in");
  // The layer's per-micro-batch state is keyed by its saved input (whole or this rank's part).
  env_.scratch.layer_input = s[0].data;
  if (recompute_.mode != Recompute::full) {
    run_forward(s, out, ctx);
    return;
  }
  // The forward of a fully recomputed layer runs in the replay set, which then holds its
  // activations until another layer uses it.
  replay_[0] = in;
  run_forward(replay_, out, ctx);
  env_.scratch.replay_of = s[0].data;
}

std::span<const Tensor> Layer::full_set(std::span<const Tensor> s, const StepContext& ctx) {
  env_.scratch.layer_input = s[0].data;
  if (recompute_.mode != Recompute::full) return s;
  if (env_.scratch.replay_of != s[0].data) {
    replay_[0] = s[0];
    if (distributed_) {
      replay_[0] = env_.scratch.whole[0];
      tp::gather_1d(*env_.tp.tp.comm, replay_[0], s[0]);
    }
    env_.moe_stats.replaying = true;
    run_forward(replay_, env_.scratch.replay_out, ctx);
    env_.moe_stats.replaying = false;
    env_.scratch.replay_of = s[0].data;
  }
  return replay_;
}

void Layer::backward_input(std::span<const Tensor> s, Stash& st, const StepContext& ctx,
                           bool then_weight) {
  const BlockScratch& sc = env_.scratch;
  const std::span<const Tensor> f = full_set(s, ctx);
  const Tensor res_in = f[0], res_mid = f[mid_];
  Stash st_mlp = st.part(st_mlp_, st_n2_ - st_mlp_), st_n2 = st.part(st_n2_, st_attn_ - st_n2_);
  Stash st_attn = st.part(st_attn_, st_n1_ - st_attn_), st_n1 = st.part(st_n1_, st_end_ - st_n1_);
  const auto f_n1 = f.subspan(n1_, attn_ - n1_), f_attn = f.subspan(attn_, n2_ - attn_);
  const auto f_n2 = f.subspan(n2_, mlp_ - n2_), f_mlp = f.subspan(mlp_, end_ - mlp_);

  // d_res: the gradient of the layer's output.
  Tensor dm = mlp_block_->backward_input(f_mlp, st_mlp, branch_grad(1, ctx));
  if (then_weight) mlp_block_->backward_weight(f_mlp, st_mlp, normed(f, 1));
  norm_2_.backward_input(f_n2, st_n2, sc.d_tmp, dm, res_mid);
  if (then_weight) norm_2_.backward_weight(st_n2);
  ops::add_inplace(sc.d_res, sc.d_tmp);
  env_.round(sc.d_res);
  // d_res: the gradient of res_mid.
  Tensor da = attn_block_->backward_input(f_attn, st_attn, branch_grad(0, ctx));
  if (then_weight) attn_block_->backward_weight(f_attn, st_attn, normed(f, 0));
  norm_1_.backward_input(f_n1, st_n1, sc.d_tmp, da, res_in);
  if (then_weight) norm_1_.backward_weight(st_n1);
  ops::add_inplace(sc.d_res, sc.d_tmp);
  env_.round(sc.d_res);
}

void Layer::backward_weight(std::span<const Tensor> s, const Stash& st, const StepContext& ctx) {
  const std::span<const Tensor> f = full_set(s, ctx);
  mlp_block_->backward_weight(f.subspan(mlp_, end_ - mlp_), st.part(st_mlp_, st_n2_ - st_mlp_),
                              normed(f, 1));
  norm_2_.backward_weight(st.part(st_n2_, st_attn_ - st_n2_));
  attn_block_->backward_weight(f.subspan(attn_, n2_ - attn_), st.part(st_attn_, st_n1_ - st_attn_),
                               normed(f, 0));
  norm_1_.backward_weight(st.part(st_n1_, st_end_ - st_n1_));
}

// ---- Embedding ----------------------------------------------------------------------------------

Embedding::Embedding(const BlockEnv& env, bool positions)
    : env_(env),
      wte_(env.param_opt("wte.weight")),
      wpe_(positions ? env.param_opt("wpe.weight") : -1),
      emb_(env.tp, env.spec.cfg.vocab_size) {}

std::vector<TensorSpec> Embedding::stash() const {
  return {{"d_out", {env_.tp.R, env_.spec.cfg.d_model}, true}};
}

void Embedding::forward(Tensor x, Tensor tokens) const {
  // Under tp the shards' lookups are summed in fp32: into d_tmp, free during a forward, when x
  // is stored in 16 bits.
  const Tensor work = x.dtype == DType::f32 || !env_.tp.parallel() ? x : env_.scratch.d_tmp;
  emb_.forward(work, tokens, env_.w(wte_), env_.w(wpe_), env_.positions());
  if (work.data == x.data)
    env_.round(x);
  else
    ops::convert(x, work);
}

void Embedding::backward_input(Stash& st, Tensor dx) const {
  st.keep(0, dx);
}

void Embedding::backward_weight(const Stash& st, Tensor tokens) const {
  emb_.backward_weight(env_.g(wte_), env_.g(wpe_), st[0], tokens, env_.positions());
}

// ---- Head ---------------------------------------------------------------------------------------

Head::Head(const BlockEnv& env, Tensor ce_max, Tensor ce_sums, bool f32_logits,
           const std::string& norm)
    : env_(env),
      f32_logits_(f32_logits),
      norm_f_(env, norm),
      head_(env.param(env.spec.cfg.tie_embeddings ? "wte.weight" : "lm_head.weight")),
      linear_(env.tp),
      loss_(env.tp, env.spec.cfg.vocab_size, ce_max, ce_sums),
      host_losses_(static_cast<size_t>(env.tp.N)) {}

std::vector<TensorSpec> Head::saved() const {
  const LocalDims d = local_dims(env_.spec, env_.tp.tp.size());
  const int64_t N = env_.tp.N;
  std::vector<TensorSpec> out{{"xf", {N, d.C}}};
  for (const TensorSpec& t : norm_f_.saved()) out.push_back(t);
  // The logits, then in place their gradient: each written by one op that rounds it to the
  // compute type (the head's GEMM, the cross-entropy), so 16-bit storage holds what the fp32
  // buffer held after its rounding.
  out.push_back({"logits", {N, d.V}, false, f32_logits_ ? DType::f32 : env_.tp.compute});
  out.push_back({"losses", {env_.B, env_.T}});
  return out;
}

std::vector<TensorSpec> Head::stash() const {
  return norm_f_.stash();
}

Tensor Head::logits(std::span<const Tensor> s, Tensor x) {
  const size_t k = norm_f_.saved().size();
  const Tensor xf = s[0], logits = s[1 + k];
  // The norm's (R,C) output is xf, or under SP gathered into xf.
  const Tensor out = linear_.input_rows(xf);
  norm_f_.forward(s.subspan(1, k), out, x);
  linear_.forward(logits, linear_.input(out, xf), env_.w(head_), Tensor());
  env_.round(logits);
  return logits;
}

float Head::forward(std::span<const Tensor> s, Tensor x, Tensor targets, float dloss) {
  const int64_t N = env_.tp.N;
  const size_t k = norm_f_.saved().size();
  const Tensor logits = this->logits(s, x), losses = s[2 + k];
  // Fused: the losses and, in place of the logits, d(dloss * mean loss)/d logits.
  loss_.forward_backward(losses.view({N}), logits, targets.view({N}),
                         dloss / static_cast<float>(N));
  // The logits gradient is the head's backward GEMM input: 16-bit, as the GEMM operands are.
  env_.round(logits);
  env_.alloc.backend().copy_to_host(host_losses_.data(), losses.data, losses.nbytes());
  const double sum = std::accumulate(host_losses_.begin(), host_losses_.end(), 0.0);
  return static_cast<float>(sum / static_cast<double>(N));
}

Tensor Head::normed(std::span<const Tensor> s) const {
  // xf (N,C): this rank's rows under SP (gathered there by logits()), all of them otherwise.
  return env_.tp.sp() ? s[0].rows(env_.tp.row0, env_.tp.row0 + env_.tp.R) : s[0];
}

void Head::backward_input(std::span<const Tensor> s, Stash& st, Tensor x, Tensor d_normed) {
  const size_t k = norm_f_.saved().size();
  Tensor dxf = linear_.backward_input(env_.scratch.d_c, s[1 + k], env_.w(head_));
  if (d_normed.defined()) {
    ops::add_inplace(dxf, d_normed.view(dxf.shape));
    env_.round(dxf);
  }
  norm_f_.backward_input(s.subspan(1, k), st, env_.scratch.d_res, dxf, x);
}

void Head::backward_weight(std::span<const Tensor> s, const Stash& st) {
  const size_t k = norm_f_.saved().size();
  linear_.backward_weight(env_.g(head_), Tensor(), s[1 + k], s[0]);
  norm_f_.backward_weight(st);
}

// ---- MtpModule ----------------------------------------------------------------------------------

namespace {
std::string mtp_prefix(const BlockEnv& env, int64_t depth) {
  return "layers." + std::to_string(env.spec.cfg.n_layers + depth - 1) + ".mtp";
}
}  // namespace

MtpModule::MtpModule(const BlockEnv& env, int64_t depth, LayerRecompute recompute,
                     std::span<Tensor> replay, Tensor ce_max, Tensor ce_sums)
    : env_(env),
      depth_(depth),
      emb_(env, /*positions=*/false),
      enorm_(env, mtp_prefix(env, depth) + ".enorm"),
      hnorm_(env, mtp_prefix(env, depth) + ".hnorm"),
      eh_(env.param(mtp_prefix(env, depth) + ".eh_proj.weight")),
      layer_(env, env.spec.cfg.n_layers + depth - 1, recompute, replay),
      head_(env, ce_max, ce_sums, false, mtp_prefix(env, depth) + ".norm") {
  LLMT_CHECK(env.tp.tp.size() == 1 || env.tp.sp(),
             "multi-token prediction under tp needs sequence parallelism (each rank projects its "
             "rows)");
  en_ = 4;
  hn_ = en_ + enorm_.saved().size();
  layer_s_ = hn_ + hnorm_.saved().size();
  head_s_ = layer_s_ + layer_.saved().size();
  end_s_ = head_s_ + head_.saved().size();
  st_en_ = 1;
  st_hn_ = st_en_ + enorm_.stash().size();
  st_hp_ = st_hn_ + hnorm_.stash().size();
  st_layer_ = st_hp_ + 1;
  st_head_ = st_layer_ + layer_.stash().size();
  st_end_ = st_head_ + head_.stash().size();
}

std::vector<TensorSpec> MtpModule::saved() const {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  const DType t = env_.tp.compute;
  std::vector<TensorSpec> out{{"tokens", {env_.B, env_.T}, false, DType::i32},
                              {"e", {R, C}, false, t},
                              {"en_hn", {R, 2 * C}, false, t},
                              {"y", {R, C}, false, t}};
  for (const auto& part : {enorm_.saved(), hnorm_.saved(), layer_.saved(), head_.saved()})
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<TensorSpec> MtpModule::stash() const {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  std::vector<TensorSpec> out = emb_.stash();
  for (const auto& part : {enorm_.stash(), hnorm_.stash()})
    out.insert(out.end(), part.begin(), part.end());
  out.push_back({"d_h_proj", {R, C}, true});
  for (const auto& part : {layer_.stash(), head_.stash()})
    out.insert(out.end(), part.begin(), part.end());
  return out;
}

float MtpModule::forward(std::span<const Tensor> s, Tensor h, Tensor tokens, Tensor labels,
                         float dloss, const StepContext& ctx) {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  const Tensor x = env_.scratch.mtp.x, e = s[1], cat = s[2];
  ops::copy(s[0], tokens);
  emb_.forward(e, s[0]);
  // [enorm(e) | hnorm(h)], each norm's output rounded to the compute type as it is written.
  enorm_.forward(s.subspan(en_, hn_ - en_), x, e);
  ops::copy_blocks(cat, x, {1, C, 0, 0, 0, 0});
  hnorm_.forward(s.subspan(hn_, layer_s_ - hn_), x, h.view({R, C}));
  ops::copy_blocks(cat, x, {1, C, C, 0, 0, 0});
  const std::span<const Tensor> ls = s.subspan(layer_s_, head_s_ - layer_s_);
  ops::linear_forward(ls[0], cat, env_.w(eh_), Tensor(), env_.tp.compute);
  env_.round(ls[0]);
  layer_.forward(ls, ls[0], s[3], ctx);
  return head_.forward(s.subspan(head_s_, end_s_ - head_s_), s[3], labels, dloss);
}

void MtpModule::backward_input(std::span<const Tensor> s, Stash& st, Tensor h, bool from_next,
                               const StepContext& ctx, bool then_weight) {
  const int64_t R = env_.tp.R, C = env_.spec.cfg.d_model;
  const BlockScratch& sc = env_.scratch;
  const BlockScratch::Mtp& m = sc.mtp;
  // The head: d y from this depth's loss and, through its norm, the next depth's hnorm's.
  const std::span<const Tensor> hs = s.subspan(head_s_, end_s_ - head_s_);
  Stash head_st = st.part(st_head_, st_end_ - st_head_);
  head_.backward_input(hs, head_st, s[3], from_next ? m.carry : Tensor());
  if (then_weight) head_.backward_weight(hs, head_st);
  // The layer: d_res becomes d h'.
  Stash layer_st = st.part(st_layer_, st_head_ - st_layer_);
  layer_.backward_input(s.subspan(layer_s_, head_s_ - layer_s_), layer_st, ctx, then_weight);
  // eh_proj: d [en | hn] (R,2C).
  const Tensor d_hp = st.keep(st_hp_, sc.d_res);
  ops::linear_backward(m.d_cat, Tensor(), Tensor(), d_hp, Tensor(), env_.w(eh_), env_.tp.compute);
  env_.round(m.d_cat);
  if (then_weight) eh_weight(s, d_hp);
  // enorm, then the embedding: d e in d_res (d h' is no longer read).
  Stash en_st = st.part(st_en_, st_hn_ - st_en_);
  ops::copy_blocks(m.x, m.d_cat, {1, C, 0, 0, 0, 0});
  enorm_.backward_input(s.subspan(en_, hn_ - en_), en_st, sc.d_res, m.x, s[1]);
  Stash emb_st = st.part(0, 1);
  emb_.backward_input(emb_st, sc.d_res);
  if (then_weight) {
    enorm_.backward_weight(en_st);
    emb_.backward_weight(emb_st, s[0]);
  }
  // hnorm: d h into the carry.
  Stash hn_st = st.part(st_hn_, st_hp_ - st_hn_);
  ops::copy_blocks(m.x, m.d_cat, {1, C, 0, 0, C, 0});
  hnorm_.backward_input(s.subspan(hn_, layer_s_ - hn_), hn_st, m.carry, m.x, h.view({R, C}));
  if (then_weight) hnorm_.backward_weight(hn_st);
}

void MtpModule::eh_weight(std::span<const Tensor> s, Tensor d_hp) const {
  ops::linear_backward(Tensor(), env_.g(eh_), Tensor(), d_hp, s[2], Tensor(), env_.tp.compute);
}

void MtpModule::backward_weight(std::span<const Tensor> s, const Stash& st,
                                const StepContext& ctx) {
  head_.backward_weight(s.subspan(head_s_, end_s_ - head_s_),
                        st.part(st_head_, st_end_ - st_head_));
  layer_.backward_weight(s.subspan(layer_s_, head_s_ - layer_s_),
                         st.part(st_layer_, st_head_ - st_layer_), ctx);
  eh_weight(s, st[st_hp_]);
  enorm_.backward_weight(st.part(st_en_, st_hn_ - st_en_));
  emb_.backward_weight(st.part(0, 1), s[0]);
  hnorm_.backward_weight(st.part(st_hn_, st_hp_ - st_hn_));
}

}  // namespace llmt
