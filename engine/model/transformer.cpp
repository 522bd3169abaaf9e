// Forward and backward of the transformer as a fixed sequence of ops (kernels/ops.h). The engine
// never touches tensor memory itself; it lays out buffers once and calls ops on views.
#include "engine/model/transformer.h"

#include <cmath>
#include <numeric>

#include "engine/core/rng.h"
#include "kernels/ops.h"

namespace llmt {

namespace {

// Lays out tensors back to back in one buffer: first pass counts bytes, second hands out views.
class Layout {
 public:
  explicit Layout(Buffer* buf = nullptr) : buf_(buf) {}
  Tensor take(Shape s, DType t = DType::f32) {
    size_t bytes = (static_cast<size_t>(s.numel()) * dtype_size(t) + 63) / 64 * 64;
    Tensor out = buf_ ? buf_->tensor(s, t, offset_) : Tensor();
    offset_ += bytes;
    return out;
  }
  size_t bytes() const { return offset_; }

 private:
  Buffer* buf_;
  size_t offset_ = 0;
};

}  // namespace

ModelWeights bind_weights(const ModelSpec& spec, const std::vector<Tensor>& views) {
  auto get = [&](const std::string& name) { return views[spec.index_of(name)]; };
  auto opt = [&](const std::string& name) {
    for (size_t i = 0; i < spec.params.size(); ++i)
      if (spec.params[i].name == name) return views[i];
    return Tensor();
  };
  ModelWeights w;
  w.wte = get("wte.weight");
  w.wpe = opt("wpe.weight");
  for (int64_t l = 0; l < spec.cfg.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.norm_1_w = get(p + "norm_1.weight");
    lw.norm_1_b = opt(p + "norm_1.bias");
    lw.qkv_w = get(p + "attn.qkv.weight");
    lw.qkv_b = opt(p + "attn.qkv.bias");
    lw.proj_w = get(p + "attn.proj.weight");
    lw.proj_b = opt(p + "attn.proj.bias");
    lw.norm_2_w = get(p + "norm_2.weight");
    lw.norm_2_b = opt(p + "norm_2.bias");
    lw.fc1_w = get(p + "mlp.fc1.weight");
    lw.fc1_b = opt(p + "mlp.fc1.bias");
    lw.fc2_w = get(p + "mlp.fc2.weight");
    lw.fc2_b = opt(p + "mlp.fc2.bias");
    w.layers.push_back(lw);
  }
  w.norm_f_w = get("norm_f.weight");
  w.norm_f_b = opt("norm_f.bias");
  w.head = spec.cfg.tie_embeddings ? w.wte : get("lm_head.weight");
  return w;
}

Transformer::Transformer(const ModelSpec& spec, Allocator& alloc, int64_t micro_batch,
                         DType compute)
    : spec_(spec), alloc_(alloc), B_(micro_batch), T_(spec.cfg.seq_len), compute_(compute) {
  LLMT_CHECK(compute == DType::f32 || compute == DType::bf16 || compute == DType::f16,
             "compute type ", dtype_name(compute));
  const auto& cfg = spec_.cfg;
  const int64_t B = B_, T = T_, C = cfg.d_model, V = cfg.vocab_size, H = cfg.n_heads;
  const int64_t KV = spec_.n_kv_heads, D = spec_.head_dim;
  const int64_t F = spec_.ffn_dim, F1 = spec_.fc1_out, N = B * T;

  // Parameters and gradients: one flat buffer each, views in spec order.
  const int64_t P = spec_.num_params();
  params_buf_ = alloc_.allocate(static_cast<size_t>(P) * 4, MemCategory::params);
  grads_buf_ = alloc_.allocate(static_cast<size_t>(P) * 4, MemCategory::grads);
  flat_params_ = params_buf_.tensor({P}, DType::f32);
  flat_grads_ = grads_buf_.tensor({P}, DType::f32);
  if (compute_ != DType::f32)
    compute_buf_ = alloc_.allocate(static_cast<size_t>(P) * 4, MemCategory::params);
  size_t off = 0;
  for (const auto& p : spec_.params) {
    params_.push_back(params_buf_.tensor(p.shape, DType::f32, off));
    grads_.push_back(grads_buf_.tensor(p.shape, DType::f32, off));
    compute_params_.push_back(compute_ != DType::f32 ? compute_buf_.tensor(p.shape, DType::f32, off)
                                                     : params_.back());
    off += static_cast<size_t>(p.shape.numel()) * 4;
  }
  // Block boundaries: spec order is wte, [wpe], layers..., norm_f, [lm_head].
  block_first_.push_back(0);
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    block_first_.push_back(spec_.index_of("layers." + std::to_string(l) + ".norm_1.weight"));
  block_first_.push_back(spec_.index_of("norm_f.weight"));
  block_first_.push_back(spec_.params.size());
  w_ = bind_weights(spec_, compute_params_);
  gw_ = bind_weights(spec_, grads_);

  // Activations of one micro-batch: lay out twice (count, then carve).
  auto carve = [&](Layout& lay) {
    acts_.assign(cfg.n_layers, {});
    for (auto& a : acts_) {
      a.res_in = lay.take({B, T, C});
      a.a = lay.take({B, T, C});
      a.mean_1 = lay.take({N});
      a.rstd_1 = lay.take({N});
      a.qkv = lay.take({B, T, H + 2 * KV, D});
      a.att = lay.take({B, T, H, D});
      a.lse = lay.take({B, H, T});
      a.res_mid = lay.take({B, T, C});
      a.m = lay.take({B, T, C});
      a.mean_2 = lay.take({N});
      a.rstd_2 = lay.take({N});
      a.u = lay.take({B, T, F1});
      a.g = lay.take({B, T, F});
    }
    res_final_ = lay.take({B, T, C});
    xf_ = lay.take({B, T, C});
    mean_f_ = lay.take({N});
    rstd_f_ = lay.take({N});
    logits_ = lay.take({B, T, V});
    losses_ = lay.take({B, T});
    d_res_ = lay.take({B, T, C});
    d_tmp_ = lay.take({B, T, C});
    d_c_ = lay.take({B, T, C});
    d_qkv_ = lay.take({B, T, H + 2 * KV, D});
    d_att_ = lay.take({B, T, H, D});
    d_u_ = lay.take({B, T, F1});
    d_g_ = lay.take({B, T, F});
    scratch_c_ = lay.take({B, T, C});
  };
  Layout count;
  carve(count);
  acts_buf_ = alloc_.allocate(count.bytes(), MemCategory::activations);
  Layout real(&acts_buf_);
  carve(real);
  host_losses_.resize(static_cast<size_t>(N));
}

std::pair<size_t, size_t> Transformer::block_params(int block) const {
  LLMT_CHECK(block >= 0 && block < num_blocks(), "block ", block, " of ", num_blocks());
  return {block_first_[block], block_first_[block + 1]};
}

void Transformer::init(uint64_t seed) {
  for (size_t i = 0; i < spec_.params.size(); ++i) {
    const ParamSpec& p = spec_.params[i];
    switch (p.init) {
      case InitKind::normal: ops::init_normal(params_[i], p.std, seed, rng::hash_name(p.name)); break;
      case InitKind::ones: ops::fill(params_[i], 1.0f); break;
      case InitKind::zeros: ops::fill(params_[i], 0.0f); break;
    }
  }
  sync_compute_weights();
}

void Transformer::sync_compute_weights() {
  if (compute_ == DType::f32) return;
  ops::copy(compute_buf_.tensor(flat_params_.shape, DType::f32), flat_params_);
  ops::round_to(compute_buf_.tensor(flat_params_.shape, DType::f32), compute_);
}

void Transformer::zero_grads() { ops::fill_zero(flat_grads_); }

void Transformer::lowp(Tensor t) const {
  if (compute_ != DType::f32) ops::round_to(t, compute_);
}

uint64_t Transformer::dropout_stream(int64_t layer, int site, int64_t step) const {
  return rng::mix64(rng::hash_name("dropout") ^ rng::mix64(static_cast<uint64_t>(layer * 2 + site)) ^
                    rng::mix64(static_cast<uint64_t>(step) + 0x51ed27ULL));
}

// out = res + dropout(branch); the dropout mask is keyed by the global element index.
void Transformer::residual_branch(Tensor out, Tensor res, Tensor branch, Tensor scratch,
                                    int64_t layer, int site, const StepContext& ctx) {
  const float p = spec_.cfg.dropout;
  if (p > 0.0f) {
    const int64_t offset = ctx.first_sample * T_ * spec_.cfg.d_model;
    ops::dropout_forward(scratch, branch, p, ctx.seed, dropout_stream(layer, site, ctx.step), offset);
    branch = scratch;
  }
  ops::add(out, res, branch);
  lowp(out);
}

void Transformer::norm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b) {
  const int64_t N = B_ * T_, C = spec_.cfg.d_model;
  if (spec_.cfg.norm == NormKind::layernorm)
    ops::layernorm_forward(out.view({N, C}), mean, rstd, inp.view({N, C}), w, b, spec_.cfg.norm_eps);
  else
    ops::rmsnorm_forward(out.view({N, C}), rstd, inp.view({N, C}), w, spec_.cfg.norm_eps);
  lowp(out);
}

void Transformer::norm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp,
                                Tensor w, Tensor mean, Tensor rstd) {
  const int64_t N = B_ * T_, C = spec_.cfg.d_model;
  if (spec_.cfg.norm == NormKind::layernorm)
    ops::layernorm_backward(dinp.view({N, C}), dw, db, dout.view({N, C}), inp.view({N, C}), w,
                            mean, rstd);
  else
    ops::rmsnorm_backward(dinp.view({N, C}), dw, dout.view({N, C}), inp.view({N, C}), w, rstd);
  lowp(dinp);
}

float Transformer::forward(Tensor tokens, Tensor targets, float dloss, const StepContext& ctx) {
  const auto& cfg = spec_.cfg;
  const int64_t N = B_ * T_, C = cfg.d_model, H = cfg.n_heads, KV = spec_.n_kv_heads;
  const int64_t D = spec_.head_dim, V = cfg.vocab_size;
  LLMT_CHECK(tokens.shape == Shape({B_, T_}) && targets.shape == Shape({B_, T_}), "tokens ",
             tokens.shape.str(), " and targets ", targets.shape.str(), " must be (", B_, ", ", T_,
             ")");
  const bool rope = cfg.position == PositionKind::rope;

  Tensor x = acts_.empty() ? res_final_ : acts_[0].res_in;  // (B,T,C)
  if (hooks_) hooks_->before_forward(0);
  ops::embedding_forward(x, tokens, w_.wte, w_.wpe);
  lowp(x);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    LayerActs& a = acts_[l];
    Tensor res_out = l + 1 < cfg.n_layers ? acts_[l + 1].res_in : res_final_;
    if (hooks_) hooks_->before_forward(static_cast<int>(l) + 1);

    norm_forward(a.a, a.mean_1, a.rstd_1, a.res_in, lw.norm_1_w, lw.norm_1_b);
    ops::linear_forward(a.qkv.view({N, spec_.qkv_dim}), a.a.view({N, C}), lw.qkv_w, lw.qkv_b);
    if (rope) ops::rope_forward(a.qkv, H + KV, 0, cfg.rope_theta);
    lowp(a.qkv);
    ops::attention_forward(a.att, a.lse, a.qkv, H, KV);
    lowp(a.att);
    ops::linear_forward(scratch_c_.view({N, C}), a.att.view({N, H * D}), lw.proj_w, lw.proj_b);
    lowp(scratch_c_);
    residual_branch(a.res_mid, a.res_in, scratch_c_, d_tmp_, l, 0, ctx);

    norm_forward(a.m, a.mean_2, a.rstd_2, a.res_mid, lw.norm_2_w, lw.norm_2_b);
    ops::linear_forward(a.u.view({N, spec_.fc1_out}), a.m.view({N, C}), lw.fc1_w, lw.fc1_b);
    lowp(a.u);
    if (cfg.activation == Activation::gelu)
      ops::gelu_forward(a.g, a.u);
    else
      ops::swiglu_forward(a.g.view({N, spec_.ffn_dim}), a.u.view({N, spec_.fc1_out}));
    lowp(a.g);
    ops::linear_forward(scratch_c_.view({N, C}), a.g.view({N, spec_.ffn_dim}), lw.fc2_w, lw.fc2_b);
    lowp(scratch_c_);
    residual_branch(res_out, a.res_mid, scratch_c_, d_tmp_, l, 1, ctx);
  }
  if (hooks_) hooks_->before_forward(static_cast<int>(cfg.n_layers) + 1);
  norm_forward(xf_, mean_f_, rstd_f_, res_final_, w_.norm_f_w, w_.norm_f_b);
  ops::linear_forward(logits_.view({N, V}), xf_.view({N, C}), w_.head, Tensor());
  lowp(logits_);
  // Fused: the losses and, in place of the logits, d(dloss * mean loss)/d logits.
  ops::softmax_cross_entropy(losses_.view({N}), logits_.view({N, V}), logits_.view({N, V}),
                             targets.view({N}), dloss / static_cast<float>(N));
  alloc_.backend().copy_to_host(host_losses_.data(), losses_.data, losses_.nbytes());
  double sum = std::accumulate(host_losses_.begin(), host_losses_.end(), 0.0);
  return static_cast<float>(sum / static_cast<double>(N));
}

void Transformer::backward(Tensor tokens, const StepContext& ctx) {
  const auto& cfg = spec_.cfg;
  const int64_t N = B_ * T_, C = cfg.d_model, H = cfg.n_heads, KV = spec_.n_kv_heads;
  const int64_t D = spec_.head_dim, V = cfg.vocab_size, F = spec_.ffn_dim, F1 = spec_.fc1_out;
  const bool rope = cfg.position == PositionKind::rope;
  const float p = cfg.dropout;
  const int64_t drop_offset = ctx.first_sample * T_ * C;
  // Gradient of a residual branch's output: d_res through the dropout mask (or d_res itself).
  auto branch_grad = [&](int64_t layer, int site) {
    if (p == 0.0f) return d_res_;
    ops::dropout_backward(d_tmp_, d_res_, p, ctx.seed, dropout_stream(layer, site, ctx.step),
                          drop_offset);
    return d_tmp_;
  };

  const int last_block = static_cast<int>(cfg.n_layers) + 1;
  if (hooks_) hooks_->before_backward(last_block);
  ops::linear_backward(d_c_.view({N, C}), gw_.head, Tensor(), logits_.view({N, V}),
                       xf_.view({N, C}), w_.head);
  lowp(d_c_);
  norm_backward(d_res_, gw_.norm_f_w, gw_.norm_f_b, d_c_, res_final_, w_.norm_f_w, mean_f_,
                rstd_f_);
  if (hooks_) hooks_->after_backward(last_block);
  for (int64_t l = cfg.n_layers - 1; l >= 0; --l) {
    if (hooks_) hooks_->before_backward(static_cast<int>(l) + 1);
    const LayerWeights& lw = w_.layers[l];
    LayerWeights& lg = gw_.layers[l];
    LayerActs& a = acts_[l];
    // d_res: gradient w.r.t. the layer's output residual stream.
    ops::linear_backward(d_g_.view({N, F}), lg.fc2_w, lg.fc2_b, branch_grad(l, 1).view({N, C}),
                         a.g.view({N, F}), lw.fc2_w);
    lowp(d_g_);
    if (cfg.activation == Activation::gelu)
      ops::gelu_backward(d_u_, d_g_, a.u);
    else
      ops::swiglu_backward(d_u_.view({N, F1}), d_g_.view({N, F}), a.u.view({N, F1}));
    lowp(d_u_);
    ops::linear_backward(d_c_.view({N, C}), lg.fc1_w, lg.fc1_b, d_u_.view({N, F1}),
                         a.m.view({N, C}), lw.fc1_w);
    lowp(d_c_);
    norm_backward(d_tmp_, lg.norm_2_w, lg.norm_2_b, d_c_, a.res_mid, lw.norm_2_w, a.mean_2,
                  a.rstd_2);
    ops::add_inplace(d_res_, d_tmp_);
    lowp(d_res_);
    // d_res: gradient w.r.t. res_mid.
    ops::linear_backward(d_att_.view({N, H * D}), lg.proj_w, lg.proj_b,
                         branch_grad(l, 0).view({N, C}), a.att.view({N, H * D}), lw.proj_w);
    lowp(d_att_);
    ops::attention_backward(d_qkv_, d_att_, a.qkv, a.att, a.lse, H, KV);
    if (rope) ops::rope_backward(d_qkv_, H + KV, 0, cfg.rope_theta);
    lowp(d_qkv_);
    ops::linear_backward(d_c_.view({N, C}), lg.qkv_w, lg.qkv_b, d_qkv_.view({N, spec_.qkv_dim}),
                         a.a.view({N, C}), lw.qkv_w);
    lowp(d_c_);
    norm_backward(d_tmp_, lg.norm_1_w, lg.norm_1_b, d_c_, a.res_in, lw.norm_1_w, a.mean_1,
                  a.rstd_1);
    ops::add_inplace(d_res_, d_tmp_);
    lowp(d_res_);
    if (hooks_) hooks_->after_backward(static_cast<int>(l) + 1);
  }
  if (hooks_) hooks_->before_backward(0);
  ops::embedding_backward(gw_.wte, gw_.wpe, d_res_, tokens);
  if (hooks_) hooks_->after_backward(0);
}

float Transformer::forward_backward(Tensor tokens, Tensor targets, float dloss,
                                    const StepContext& ctx) {
  float loss = forward(tokens, targets, dloss, ctx);
  backward(tokens, ctx);
  return loss;
}

float Transformer::forward_loss(Tensor tokens, Tensor targets, const StepContext& ctx) {
  return forward(tokens, targets, 0.0f, ctx);
}

}  // namespace llmt
