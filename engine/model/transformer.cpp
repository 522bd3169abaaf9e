// Forward and backward of the transformer as a fixed sequence of ops (kernels/ops.h). The engine
// never touches tensor memory itself; it lays out buffers once and calls ops on views.
#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/core/rng.h"
#include "kernels/ops.h"

namespace llmt {

// Lays out tensors back to back in one buffer: first pass counts bytes, second hands out views.
class Transformer::Layout {
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

ModelWeights bind_weights(const ModelSpec& spec, const std::vector<Tensor>& views) {
  auto get = [&](const std::string& name) { return views[spec.index_of(name)]; };
  auto opt = [&](const std::string& name) {
    for (size_t i = 0; i < spec.params.size(); ++i)
      if (spec.params[i].name == name) return views[i];
    return Tensor();
  };
  ModelWeights w;
  w.wte = opt("wte.weight");
  w.wpe = opt("wpe.weight");
  for (int64_t l : spec.layers()) {
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
  w.norm_f_w = opt("norm_f.weight");
  w.norm_f_b = opt("norm_f.bias");
  w.head = spec.cfg.tie_embeddings ? w.wte : opt("lm_head.weight");
  return w;
}

Transformer::Transformer(const ModelSpec& spec, Allocator& alloc, int64_t micro_batch,
                         DType compute, ModelStorage storage, TensorParallel tp)
    : spec_(tp.size() > 1 && spec.tp_size == 1 ? spec.shard_tp(tp.size(), tp.rank()) : spec),
      alloc_(alloc),
      B_(micro_batch),
      T_(spec.cfg.seq_len),
      compute_(compute),
      storage_(storage),
      tp_(tp) {
  LLMT_CHECK(compute == DType::f32 || compute == DType::bf16 || compute == DType::f16,
             "compute type ", dtype_name(compute));
  LLMT_CHECK(spec_.tp_size == tp_.size() && spec_.tp_rank == tp_.rank(),
             "the model spec is for tp ", "rank ", spec_.tp_rank, " of ", spec_.tp_size,
             ", the tp group has rank ", tp_.rank(), " of ", tp_.size());
  const auto& cfg = spec_.cfg;
  const int p = tp_.size();
  H_ = cfg.n_heads / p;
  KV_ = spec_.n_kv_heads / p;
  F_ = spec_.ffn_dim / p;
  F1_ = spec_.fc1_out / p;
  V_ = cfg.vocab_size / p;
  vocab_start_ = tp_.rank() * V_;
  sp_ = tp_.sequence_parallel && p > 1;
  R_ = B_ * T_;
  if (sp_) {
    LLMT_CHECK(R_ % p == 0, "sequence parallel: the micro-batch's ", B_, "x", T_,
               " tokens are not divisible by tp=", p);
    R_ /= p;
    row0_ = tp_.rank() * R_;
  }
  const int64_t B = B_, T = T_, C = cfg.d_model, H = H_, KV = KV_, R = R_;
  const int64_t D = spec_.head_dim, F = F_, F1 = F1_, N = B * T;

  // Parameters and gradients: one flat buffer each, views in spec order (views without memory
  // for what ModelStorage leaves to the caller, until bind_block).
  const int64_t P = spec_.num_local_params();
  if (storage_.params) {
    params_buf_ = alloc_.allocate(static_cast<size_t>(P) * 4, MemCategory::params);
    flat_params_ = params_buf_.tensor({P}, DType::f32);
    if (compute_ != DType::f32)
      compute_buf_ = alloc_.allocate(static_cast<size_t>(P) * 4, MemCategory::params);
  }
  if (storage_.grads) {
    grads_buf_ = alloc_.allocate(static_cast<size_t>(P) * 4, MemCategory::grads);
    flat_grads_ = grads_buf_.tensor({P}, DType::f32);
  }
  size_t off = 0;
  for (size_t i = 0; i < spec_.params.size(); ++i) {
    const Shape& shape = spec_.params[i].shape;  // this tp rank's
    params_.push_back(storage_.params ? params_buf_.tensor(shape, DType::f32, off)
                                      : Tensor(nullptr, shape, DType::f32, alloc_.device()));
    grads_.push_back(storage_.grads ? grads_buf_.tensor(shape, DType::f32, off)
                                    : Tensor(nullptr, shape, DType::f32, alloc_.device()));
    compute_params_.push_back(storage_.params && compute_ != DType::f32
                                  ? compute_buf_.tensor(shape, DType::f32, off)
                                  : params_.back());
    off += static_cast<size_t>(shape.numel()) * 4;
  }
  // Block boundaries: spec order is wte, [wpe], layers..., norm_f, [lm_head] (a pipeline stage
  // holds a subsequence; its other blocks are empty).
  const int64_t L = cfg.n_layers;
  auto block_of = [&](const std::string& name) -> int64_t {
    if (name.rfind("layers.", 0) == 0) return std::stoll(name.substr(7)) + 1;
    return name == "wte.weight" || name == "wpe.weight" ? 0 : L + 1;
  };
  for (int64_t b = 0, i = 0; b <= L + 2; ++b) {
    while (i < static_cast<int64_t>(spec_.params.size()) && block_of(spec_.params[i].name) < b) ++i;
    block_first_.push_back(static_cast<size_t>(i));
  }
  layers_ = spec_.layers();
  chunk_first_.push_back(0);
  for (const auto& [b, e] : spec_.chunks) chunk_first_.push_back(chunk_first_.back() + (e - b));
  w_ = bind_weights(spec_, compute_params_);
  gw_ = bind_weights(spec_, grads_);

  // Scratch shared by every micro-batch: lay out twice (count, then carve).
  auto carve = [&](Layout& lay) {
    if (p > 1) {
      ce_max_ = lay.take({N});
      ce_sums_ = lay.take({2, N});
    }
    d_res_ = lay.take({R, C});
    d_tmp_ = lay.take({R, C});
    d_c_ = lay.take({N, C});
    d_qkv_ = lay.take({B, T, H + 2 * KV, D});
    d_att_ = lay.take({B, T, H, D});
    d_u_ = lay.take({B, T, F1});
    d_g_ = lay.take({B, T, F});
    scratch_c_ = lay.take({N, C});
    if (sp_) {
      gather_ = lay.take({N, C});
      branch_ = lay.take({R, C});
      sp_dnorm_ = lay.take({2, C});
    }
  };
  Layout count;
  carve(count);
  scratch_buf_ = alloc_.allocate(count.bytes(), MemCategory::activations);
  Layout real(&scratch_buf_);
  carve(real);
  if (num_chunks() == 1 && spec_.has_embedding && spec_.has_head) {
    // The whole model: one micro-batch's activations, kept for the model's lifetime.
    Layout acount;
    carve_acts(acount, whole_, 0);
    whole_.buf = alloc_.allocate(acount.bytes(), MemCategory::activations);
    Layout areal(&whole_.buf);
    carve_acts(areal, whole_, 0);
  } else {
    pipe_acts_.resize(spec_.chunks.size());
  }
  host_losses_.resize(static_cast<size_t>(N));
}

void Transformer::carve_acts(Layout& lay, Acts& a, int chunk) const {
  const int64_t B = B_, T = T_, C = spec_.cfg.d_model, H = H_, KV = KV_, R = R_, N = B * T;
  const int64_t D = spec_.head_dim;
  a.layers.assign(static_cast<size_t>(chunk_first_[chunk + 1] - chunk_first_[chunk]), {});
  for (LayerActs& l : a.layers) {
    l.res_in = lay.take({R, C});
    l.a = lay.take({R, C});
    l.mean_1 = lay.take({R});
    l.rstd_1 = lay.take({R});
    l.qkv = lay.take({B, T, H + 2 * KV, D});
    l.att = lay.take({B, T, H, D});
    l.lse = lay.take({B, H, T});
    l.res_mid = lay.take({R, C});
    l.m = lay.take({R, C});
    l.mean_2 = lay.take({R});
    l.rstd_2 = lay.take({R});
    l.u = lay.take({B, T, F1_});
    l.g = lay.take({B, T, F_});
  }
  a.out = lay.take({R, C});
  if (chunk_has_head(chunk)) {
    a.xf = lay.take({N, C});
    a.mean_f = lay.take({R});
    a.rstd_f = lay.take({R});
    a.logits = lay.take({N, V_});
    a.losses = lay.take({B, T});
  }
}

Transformer::Acts& Transformer::acts_of(int chunk, int mb) {
  LLMT_CHECK(chunk >= 0 && chunk < num_chunks() && mb >= 0, "chunk ", chunk, " of ", num_chunks(),
             ", micro-batch ", mb);
  LLMT_CHECK(!pipe_acts_.empty(), "the pipeline API needs a pipeline-stage spec (shard_pp)");
  std::vector<Acts>& per_mb = pipe_acts_[static_cast<size_t>(chunk)];
  if (per_mb.size() <= static_cast<size_t>(mb)) per_mb.resize(static_cast<size_t>(mb) + 1);
  Acts& a = per_mb[static_cast<size_t>(mb)];
  if (!a.buf.data()) {
    Layout count;
    carve_acts(count, a, chunk);
    a.buf = alloc_.allocate(count.bytes(), MemCategory::activations);
    Layout real(&a.buf);
    carve_acts(real, a, chunk);
  }
  return a;
}

size_t Transformer::chunk_activation_bytes(int chunk) const {
  Layout count;
  Acts a;
  carve_acts(count, a, chunk);
  return count.bytes();
}

Tensor Transformer::chunk_input(int chunk, int mb) {
  return input_of(acts_of(chunk, mb));
}

Tensor Transformer::chunk_output(int chunk, int mb) {
  return acts_of(chunk, mb).out;
}

float Transformer::forward_chunk(int chunk, int mb, Tensor tokens, Tensor targets, float dloss,
                                 const StepContext& ctx) {
  return forward(chunk, acts_of(chunk, mb), tokens, targets, dloss, ctx);
}

Tensor Transformer::backward_chunk(int chunk, int mb, Tensor dout, Tensor tokens,
                                   const StepContext& ctx) {
  Acts& a = acts_of(chunk, mb);
  if (!chunk_has_head(chunk)) {
    LLMT_CHECK(dout.defined() && dout.shape == d_res_.shape, "backward_chunk(", chunk, ", ", mb,
               "): the output gradient must be ", d_res_.shape.str());
    ops::copy(d_res_, dout);
  }
  backward(chunk, a, tokens, ctx);
  return chunk_has_embedding(chunk) ? Tensor() : d_res_;
}

void Transformer::free_chunk(int chunk, int mb) {
  LLMT_CHECK(chunk >= 0 && chunk < static_cast<int>(pipe_acts_.size()) && mb >= 0 &&
                 static_cast<size_t>(mb) < pipe_acts_[static_cast<size_t>(chunk)].size(),
             "free_chunk(", chunk, ", ", mb, "): nothing allocated");
  pipe_acts_[static_cast<size_t>(chunk)][static_cast<size_t>(mb)] = Acts{};
}

std::pair<size_t, size_t> Transformer::block_params(int block) const {
  LLMT_CHECK(block >= 0 && block < num_blocks(), "block ", block, " of ", num_blocks());
  return {block_first_[block], block_first_[block + 1]};
}

void Transformer::bind_block(int block, Tensor weights, Tensor grads) {
  const auto [first, last] = block_params(block);
  LLMT_CHECK(!weights.defined() || !storage_.params, "bind_block: the model owns its weights");
  LLMT_CHECK(!grads.defined() || !storage_.grads, "bind_block: the model owns its gradients");
  int64_t off = 0;
  for (size_t i = first; i < last; ++i) {
    const Shape& shape = spec_.params[i].shape;
    const int64_t n = shape.numel();
    if (weights.defined()) {
      LLMT_CHECK(off + n <= weights.numel(), "bind_block(", block, "): weights ", describe(weights),
                 " too small");
      compute_params_[i] = Tensor(weights.f32() + off, shape, DType::f32, weights.device);
      params_[i] = compute_params_[i];
    }
    if (grads.defined()) {
      LLMT_CHECK(off + n <= grads.numel(), "bind_block(", block, "): grads ", describe(grads),
                 " too small");
      grads_[i] = Tensor(grads.f32() + off, shape, DType::f32, grads.device);
    }
    off += n;
  }
  // Assigned member by member: forward/backward may hold references into the layer vectors
  // while a hook rebinds.
  auto rebind = [&](ModelWeights& dst, const std::vector<Tensor>& views) {
    ModelWeights fresh = bind_weights(spec_, views);
    std::copy(fresh.layers.begin(), fresh.layers.end(), dst.layers.begin());
    dst.wte = fresh.wte;
    dst.wpe = fresh.wpe;
    dst.norm_f_w = fresh.norm_f_w;
    dst.norm_f_b = fresh.norm_f_b;
    dst.head = fresh.head;
  };
  if (weights.defined()) rebind(w_, compute_params_);
  if (grads.defined()) rebind(gw_, grads_);
}

void init_param_rows(const ModelSpec& spec, size_t i, Tensor x, int64_t row_begin, uint64_t seed) {
  const ParamSpec& p = spec.params[i];
  LLMT_CHECK(x.ndim() == p.shape.ndim() && row_begin >= 0 && row_begin + x.shape[0] <= p.shape[0],
             p.name, ": rows [", row_begin, ", ", row_begin + x.shape[0], ") of ", p.shape.str());
  if (p.init != InitKind::normal) {
    ops::fill(x, p.init == InitKind::ones ? 1.0f : 0.0f);
    return;
  }
  const uint64_t stream = rng::hash_name(p.name);
  const Shape& g = p.global_shape;
  const int64_t row = g.numel() / g[0];  // global elements per dim-0 index
  if (!p.tp.sharded() || spec.tp_size == 1) {
    ops::init_normal(x, p.std, seed, stream, row_begin * row);
    return;
  }
  const int64_t row_end = row_begin + x.shape[0];
  for (const ShardSlice& s : spec.local_slices(i)) {
    if (s.dim == 0) {  // local rows [local_start, +length) are global rows [global_start, +length)
      const int64_t lo = std::max(row_begin, s.local_start);
      const int64_t hi = std::min(row_end, s.local_start + s.length);
      if (lo < hi)
        ops::init_normal(x.rows(lo - row_begin, hi - row_begin), p.std, seed, stream,
                         (s.global_start + lo - s.local_start) * row);
    } else {  // one column slice of a 2-D weight: every row's columns [global_start, +length)
      LLMT_CHECK(s.dim == 1 && g.ndim() == 2 && s.local_start == 0 && s.length == p.shape[1],
                 p.name, ": only one column slice of a 2-D tensor is supported, got ", p.tp.str());
      ops::init_normal(x, p.std, seed, stream, row_begin * g[1] + s.global_start, g[1]);
    }
  }
}

void Transformer::init(uint64_t seed) {
  LLMT_CHECK(storage_.params,
             "init: the parameters are not the model's (ZeRO-3 initialises its shards)");
  for (size_t i = 0; i < spec_.params.size(); ++i) {
    const ParamSpec& p = spec_.params[i];
    switch (p.init) {
      case InitKind::normal:
        init_param_rows(spec_, i, params_[i], 0, seed);
        break;
      case InitKind::ones:
        ops::fill(params_[i], 1.0f);
        break;
      case InitKind::zeros:
        ops::fill(params_[i], 0.0f);
        break;
    }
  }
  sync_compute_weights();
}

void Transformer::sync_compute_weights() {
  if (compute_ == DType::f32 || !storage_.params) return;
  ops::copy(compute_buf_.tensor(flat_params_.shape, DType::f32), flat_params_);
  ops::round_to(compute_buf_.tensor(flat_params_.shape, DType::f32), compute_);
}

void Transformer::zero_grads() {
  if (storage_.grads) ops::fill_zero(flat_grads_);
}

void Transformer::lowp(Tensor t) const {
  if (compute_ != DType::f32) ops::round_to(t, compute_);
}

uint64_t Transformer::dropout_stream(int64_t layer, int site, int64_t step) const {
  return rng::mix64(rng::hash_name("dropout") ^
                    rng::mix64(static_cast<uint64_t>(layer * 2 + site)) ^
                    rng::mix64(static_cast<uint64_t>(step) + 0x51ed27ULL));
}

// out = res + dropout(branch); the dropout mask is keyed by the global element index (under
// sequence parallelism this rank's rows start at global row row0_).
void Transformer::residual_branch(Tensor out, Tensor res, Tensor branch, Tensor scratch,
                                  int64_t layer, int site, const StepContext& ctx) {
  const float p = ctx.dropout ? spec_.cfg.dropout : 0.0f;
  if (p > 0.0f) {
    const int64_t offset = (ctx.first_sample * T_ + row0_) * spec_.cfg.d_model;
    ops::dropout_forward(scratch, branch, p, ctx.seed, dropout_stream(layer, site, ctx.step),
                         offset);
    branch = scratch;
  }
  ops::add(out, res, branch);
  lowp(out);
}

void Transformer::norm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w,
                               Tensor b) {
  const int64_t R = R_, C = spec_.cfg.d_model;
  if (spec_.cfg.norm == NormKind::layernorm)
    ops::layernorm_forward(out.view({R, C}), mean, rstd, inp.view({R, C}), w, b,
                           spec_.cfg.norm_eps);
  else
    ops::rmsnorm_forward(out.view({R, C}), rstd, inp.view({R, C}), w, spec_.cfg.norm_eps);
  lowp(out);
}

// Under sequence parallelism a rank normalises only its rows, so its weight and bias gradients
// are partial sums over the sequence: they are completed by an all-reduce over tp (of this
// micro-batch's share only, so accumulation over micro-batches is not multiplied) before being
// added into the gradients. Without SP every tp rank sees all rows and gets the whole gradient.
void Transformer::norm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp,
                                Tensor w, Tensor mean, Tensor rstd) {
  const int64_t R = R_, C = spec_.cfg.d_model;
  Tensor pdw = dw, pdb = db;
  if (sp_) {
    ops::fill_zero(sp_dnorm_);
    pdw = sp_dnorm_.rows(0, 1).view({C});
    pdb = db.defined() ? sp_dnorm_.rows(1, 2).view({C}) : Tensor();
  }
  if (spec_.cfg.norm == NormKind::layernorm)
    ops::layernorm_backward(dinp.view({R, C}), pdw, pdb, dout.view({R, C}), inp.view({R, C}), w,
                            mean, rstd);
  else
    ops::rmsnorm_backward(dinp.view({R, C}), pdw, dout.view({R, C}), inp.view({R, C}), w, rstd);
  lowp(dinp);
  if (sp_) {
    tp::copy_to_region_backward(*tp_.comm, sp_dnorm_);
    ops::add_inplace(dw, pdw);
    if (db.defined()) ops::add_inplace(db, pdb);
  }
}

Tensor Transformer::column_input(Tensor a) {
  if (!sp_) return a;  // copy_to_region forward: identity
  tp::gather_from_sequence_forward(*tp_.comm, gather_, a);
  return gather_;
}

Tensor Transformer::row_output(Tensor partial, Tensor bias) {
  if (tp_.size() == 1) return partial;  // the linear added the bias
  Tensor out = partial;
  if (sp_) {
    tp::reduce_scatter_to_sequence_forward(*tp_.comm, branch_, partial);
    out = branch_;
  } else {
    tp::reduce_from_region_forward(*tp_.comm, partial);
  }
  if (bias.defined()) ops::add_bias(out, bias);
  return out;
}

Tensor Transformer::row_output_grad(Tensor dbranch) {
  if (!sp_) return dbranch;  // reduce_from_region backward: identity
  tp::reduce_scatter_to_sequence_backward(*tp_.comm, scratch_c_, dbranch);
  return scratch_c_;
}

Tensor Transformer::column_input_grad(Tensor dinp) {
  if (tp_.size() == 1) return dinp;
  if (!sp_) {
    tp::copy_to_region_backward(*tp_.comm, dinp);
    return dinp;
  }
  tp::gather_from_sequence_backward(*tp_.comm, branch_, dinp);
  return branch_;
}

float Transformer::forward(int chunk, Acts& acts, Tensor tokens, Tensor targets, float dloss,
                           const StepContext& ctx) {
  const auto& cfg = spec_.cfg;
  const int64_t B = B_, T = T_, N = B * T, C = cfg.d_model;
  const bool tp = tp_.size() > 1;
  Tensor x = input_of(acts);  // (R,C)
  auto is_bt = [&](const Tensor& t) { return t.ndim() == 2 && t.shape[0] == B && t.shape[1] == T; };
  if (chunk_has_embedding(chunk)) {
    LLMT_CHECK(is_bt(tokens), "tokens ", tokens.shape.str(), " must be (", B_, ", ", T_, ")");
    if (hooks_) hooks_->before_forward(0);
    if (!tp) {
      ops::embedding_forward(x.view({B, T, C}), tokens, w_.wte, w_.wpe);
    } else {
      // Vocab-parallel embedding: each rank looks up only its vocabulary rows (zeros elsewhere),
      // rank 0 adds the positions, and the sum over tp is the full embedding (all-reduce, or
      // reduce-scatter to this rank's rows under SP).
      Tensor full = sp_ ? scratch_c_ : x;
      ops::embedding_forward(full.view({B, T, C}), tokens, w_.wte,
                             tp_.rank() == 0 ? w_.wpe : Tensor(), 0, vocab_start_, cfg.vocab_size);
      if (sp_)
        tp::reduce_scatter_to_sequence_forward(*tp_.comm, x, full);
      else
        tp::reduce_from_region_forward(*tp_.comm, x);
    }
    lowp(x);
  }
  const int64_t first = chunk_first_[chunk], n = chunk_first_[chunk + 1] - first;
  for (int64_t j = 0; j < n; ++j)
    layer_forward(first + j, acts.layers[j], j + 1 < n ? acts.layers[j + 1].res_in : acts.out, ctx);
  if (!chunk_has_head(chunk)) return 0.0f;

  LLMT_CHECK(is_bt(targets), "targets ", targets.shape.str(), " must be (", B_, ", ", T_, ")");
  if (hooks_) hooks_->before_forward(static_cast<int>(cfg.n_layers) + 1);
  norm_forward(sp_ ? branch_ : acts.xf, acts.mean_f, acts.rstd_f, acts.out, w_.norm_f_w,
               w_.norm_f_b);
  if (sp_) tp::gather_from_sequence_forward(*tp_.comm, acts.xf, branch_);
  ops::linear_forward(acts.logits, acts.xf, w_.head, Tensor(), compute_);
  lowp(acts.logits);
  // Fused: the losses and, in place of the logits, d(dloss * mean loss)/d logits.
  if (!tp)
    ops::softmax_cross_entropy(acts.losses.view({N}), acts.logits, acts.logits, targets.view({N}),
                               dloss / static_cast<float>(N));
  else
    tp::vocab_parallel_cross_entropy(*tp_.comm, acts.losses.view({N}), acts.logits,
                                     targets.view({N}), vocab_start_, cfg.vocab_size,
                                     dloss / static_cast<float>(N), ce_max_, ce_sums_);
  // The logits gradient is the head's backward GEMM input: 16-bit, as the GEMM operands are.
  lowp(acts.logits);
  alloc_.backend().copy_to_host(host_losses_.data(), acts.losses.data, acts.losses.nbytes());
  double sum = std::accumulate(host_losses_.begin(), host_losses_.end(), 0.0);
  return static_cast<float>(sum / static_cast<double>(N));
}

// res_out (R,C) = layer `local`(a.res_in); a holds what its backward needs.
void Transformer::layer_forward(int64_t local, LayerActs& a, Tensor res_out,
                                const StepContext& ctx) {
  const auto& cfg = spec_.cfg;
  const int64_t N = B_ * T_, H = H_, KV = KV_;
  const int64_t D = spec_.head_dim, Q = (H + 2 * KV) * D;
  const int64_t l = layers_[local];  // global: dropout streams and hooks
  const bool tp = tp_.size() > 1;
  // Row-parallel linears add their bias after the reduction (row_output) under tp.
  auto row_bias = [&](Tensor b) { return tp ? Tensor() : b; };
  const LayerWeights& lw = w_.layers[local];
  if (hooks_) hooks_->before_forward(static_cast<int>(l) + 1);

  norm_forward(a.a, a.mean_1, a.rstd_1, a.res_in, lw.norm_1_w, lw.norm_1_b);
  ops::linear_forward(a.qkv.view({N, Q}), column_input(a.a), lw.qkv_w, lw.qkv_b, compute_);
  if (cfg.position == PositionKind::rope) ops::rope_forward(a.qkv, H + KV, 0, cfg.rope_theta);
  lowp(a.qkv);
  ops::attention_forward(a.att, a.lse, a.qkv, H, KV, compute_);  // qkv holds compute_ values
  lowp(a.att);
  ops::linear_forward(scratch_c_, a.att.view({N, H * D}), lw.proj_w, row_bias(lw.proj_b), compute_);
  Tensor y = row_output(scratch_c_, lw.proj_b);
  lowp(y);
  residual_branch(a.res_mid, a.res_in, y, d_tmp_, l, 0, ctx);

  norm_forward(a.m, a.mean_2, a.rstd_2, a.res_mid, lw.norm_2_w, lw.norm_2_b);
  ops::linear_forward(a.u.view({N, F1_}), column_input(a.m), lw.fc1_w, lw.fc1_b, compute_);
  lowp(a.u);
  if (cfg.activation == Activation::gelu)
    ops::gelu_forward(a.g, a.u);
  else
    ops::swiglu_forward(a.g.view({N, F_}), a.u.view({N, F1_}));
  lowp(a.g);
  ops::linear_forward(scratch_c_, a.g.view({N, F_}), lw.fc2_w, row_bias(lw.fc2_b), compute_);
  y = row_output(scratch_c_, lw.fc2_b);
  lowp(y);
  residual_branch(res_out, a.res_mid, y, d_tmp_, l, 1, ctx);
}

// d_res_ (R,C): on entry the gradient of the layer's output, on return of its input. With
// `stash` (zero-bubble input part) the linears compute only their input gradients and leave their
// output gradients in the stash, and the norms' weight gradients go to stash->norm.
void Transformer::layer_backward(int64_t local, LayerActs& a, const StepContext& ctx,
                                 LayerStash* stash) {
  const auto& cfg = spec_.cfg;
  const int64_t N = B_ * T_, H = H_, KV = KV_, C = cfg.d_model;
  const int64_t D = spec_.head_dim, F = F_, F1 = F1_, Q = (H + 2 * KV) * D;
  const int64_t l = layers_[local];
  const float p = ctx.dropout ? cfg.dropout : 0.0f;
  const int64_t drop_offset = (ctx.first_sample * T_ + row0_) * C;
  // Gradient of a residual branch's output (R,C): d_res through the dropout mask (or d_res);
  // 16-bit, as it is the output gradient of a linear (the 1/(1-p) scaling leaves the grid).
  auto branch_grad = [&](int site) {
    if (p == 0.0f) return d_res_;
    ops::dropout_backward(d_tmp_, d_res_, p, ctx.seed, dropout_stream(l, site, ctx.step),
                          drop_offset);
    lowp(d_tmp_);
    return d_tmp_;
  };
  const LayerWeights& lw = w_.layers[local];
  LayerWeights& lg = gw_.layers[local];
  // A linear's backward: whole, or (zero-bubble) dinp only with dout kept in `kept`.
  auto linear = [&](Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                    Tensor kept) {
    if (!stash) return ops::linear_backward(dinp, dw, db, dout, inp, w, compute_);
    ops::copy(kept, dout);
    ops::linear_backward(dinp, Tensor(), Tensor(), dout, inp, w, compute_);
  };
  // The norm k's weight and bias gradients: the model's, or its rows of the stash (the bias's
  // only for layernorm; not read from `db`, which ZeRO-2 may not have bound yet).
  const bool norm_bias = cfg.norm == NormKind::layernorm;
  auto norm_grads = [&](int k, Tensor dw, Tensor db) -> std::pair<Tensor, Tensor> {
    if (!stash) return {dw, db};
    return {stash->norm.rows(2 * k, 2 * k + 1).view({C}),
            norm_bias ? stash->norm.rows(2 * k + 1, 2 * k + 2).view({C}) : Tensor()};
  };
  LayerStash none;
  LayerStash& st = stash ? *stash : none;
  if (hooks_ && !stash) hooks_->before_backward(static_cast<int>(l) + 1);
  // d_res: gradient w.r.t. the layer's output residual stream. Row-parallel biases get their
  // whole gradient from the (gathered) dy, the same on every tp rank.
  linear(d_g_.view({N, F}), lg.fc2_w, lg.fc2_b, row_output_grad(branch_grad(1)), a.g.view({N, F}),
         lw.fc2_w, st.fc2);
  lowp(d_g_);
  if (cfg.activation == Activation::gelu)
    ops::gelu_backward(d_u_, d_g_, a.u);
  else
    ops::swiglu_backward(d_u_.view({N, F1}), d_g_.view({N, F}), a.u.view({N, F1}));
  lowp(d_u_);
  // fc1's input (N,C) again: under SP only this rank's rows were kept, so they are gathered
  // once more (Megatron's trade: R rows of memory per layer, not N, for one all-gather).
  linear(d_c_, lg.fc1_w, lg.fc1_b, d_u_.view({N, F1}), column_input(a.m), lw.fc1_w, st.fc1);
  lowp(d_c_);
  const auto [n2w, n2b] = norm_grads(1, lg.norm_2_w, lg.norm_2_b);
  norm_backward(d_tmp_, n2w, n2b, column_input_grad(d_c_), a.res_mid, lw.norm_2_w, a.mean_2,
                a.rstd_2);
  ops::add_inplace(d_res_, d_tmp_);
  lowp(d_res_);
  // d_res: gradient w.r.t. res_mid.
  linear(d_att_.view({N, H * D}), lg.proj_w, lg.proj_b, row_output_grad(branch_grad(0)),
         a.att.view({N, H * D}), lw.proj_w, st.proj);
  lowp(d_att_);
  ops::attention_backward(d_qkv_, d_att_, a.qkv, a.att, a.lse, H, KV, compute_);
  if (cfg.position == PositionKind::rope) ops::rope_backward(d_qkv_, H + KV, 0, cfg.rope_theta);
  lowp(d_qkv_);
  linear(d_c_, lg.qkv_w, lg.qkv_b, d_qkv_.view({N, Q}), column_input(a.a), lw.qkv_w, st.qkv);
  lowp(d_c_);
  const auto [n1w, n1b] = norm_grads(0, lg.norm_1_w, lg.norm_1_b);
  norm_backward(d_tmp_, n1w, n1b, column_input_grad(d_c_), a.res_in, lw.norm_1_w, a.mean_1,
                a.rstd_1);
  ops::add_inplace(d_res_, d_tmp_);
  lowp(d_res_);
  if (hooks_ && !stash) hooks_->after_backward(static_cast<int>(l) + 1);
}

// The weight part of a layer's backward from its stash (same order of accumulation as the
// full backward: fc2, fc1, norm_2, proj, qkv, norm_1).
void Transformer::layer_backward_weight(int64_t local, LayerActs& a, const LayerStash& st) {
  const int64_t N = B_ * T_, C = spec_.cfg.d_model;
  const int64_t l = layers_[local];
  const LayerWeights& lw = w_.layers[local];
  LayerWeights& lg = gw_.layers[local];
  auto add_norm = [&](int k, Tensor dw, Tensor db) {
    ops::add_inplace(dw, st.norm.rows(2 * k, 2 * k + 1).view({C}));
    if (db.defined()) ops::add_inplace(db, st.norm.rows(2 * k + 1, 2 * k + 2).view({C}));
  };
  if (hooks_) hooks_->before_backward(static_cast<int>(l) + 1);
  ops::linear_backward(Tensor(), lg.fc2_w, lg.fc2_b, st.fc2, a.g.view({N, F_}), lw.fc2_w, compute_);
  ops::linear_backward(Tensor(), lg.fc1_w, lg.fc1_b, st.fc1, column_input(a.m), lw.fc1_w, compute_);
  add_norm(1, lg.norm_2_w, lg.norm_2_b);
  ops::linear_backward(Tensor(), lg.proj_w, lg.proj_b, st.proj,
                       a.att.view({N, H_ * spec_.head_dim}), lw.proj_w, compute_);
  ops::linear_backward(Tensor(), lg.qkv_w, lg.qkv_b, st.qkv, column_input(a.a), lw.qkv_w, compute_);
  add_norm(0, lg.norm_1_w, lg.norm_1_b);
  if (hooks_) hooks_->after_backward(static_cast<int>(l) + 1);
}

void Transformer::carve_stash(Layout& lay, Acts& a, int chunk) const {
  const int64_t N = B_ * T_, C = spec_.cfg.d_model;
  const int64_t Q = (H_ + 2 * KV_) * spec_.head_dim;
  a.stash.assign(a.layers.size(), {});
  for (LayerStash& st : a.stash) {
    st.fc2 = lay.take({N, C});
    st.fc1 = lay.take({N, F1_});
    st.proj = lay.take({N, C});
    st.qkv = lay.take({N, Q});
    st.norm = lay.take({4, C});
  }
  if (chunk_has_head(chunk)) a.norm_f_stash = lay.take({2, C});
  if (chunk_has_embedding(chunk)) a.d_emb = lay.take({R_, C});
}

size_t Transformer::chunk_stash_bytes(int chunk) const {
  Layout count;
  Acts a;
  a.layers.resize(static_cast<size_t>(chunk_first_[chunk + 1] - chunk_first_[chunk]));
  carve_stash(count, a, chunk);
  return count.bytes();
}

Tensor Transformer::backward_input_chunk(int chunk, int mb, Tensor dout, const StepContext& ctx) {
  Acts& a = acts_of(chunk, mb);
  const int64_t C = spec_.cfg.d_model;
  Layout count;
  carve_stash(count, a, chunk);
  a.stash_buf = alloc_.allocate(count.bytes(), MemCategory::activations);  // zeroed
  Layout real(&a.stash_buf);
  carve_stash(real, a, chunk);
  if (chunk_has_head(chunk)) {
    ops::linear_backward(d_c_, Tensor(), Tensor(), a.logits, a.xf, w_.head, compute_);
    lowp(d_c_);
    Tensor nb =
        spec_.cfg.norm == NormKind::layernorm ? a.norm_f_stash.rows(1, 2).view({C}) : Tensor();
    norm_backward(d_res_, a.norm_f_stash.rows(0, 1).view({C}), nb, column_input_grad(d_c_), a.out,
                  w_.norm_f_w, a.mean_f, a.rstd_f);
  } else {
    LLMT_CHECK(dout.defined() && dout.shape == d_res_.shape, "backward_input_chunk(", chunk, ", ",
               mb, "): the output gradient must be ", d_res_.shape.str());
    ops::copy(d_res_, dout);
  }
  const int64_t first = chunk_first_[chunk];
  for (int64_t j = chunk_first_[chunk + 1] - first - 1; j >= 0; --j)
    layer_backward(first + j, a.layers[j], ctx, &a.stash[j]);
  if (chunk_has_embedding(chunk)) {
    ops::copy(a.d_emb, d_res_);
    return Tensor();
  }
  return d_res_;
}

void Transformer::backward_weight_chunk(int chunk, int mb, Tensor tokens) {
  Acts& a = acts_of(chunk, mb);
  LLMT_CHECK(a.stash_buf.data(), "backward_weight_chunk(", chunk, ", ", mb,
             ") before its backward_input_chunk");
  const auto& cfg = spec_.cfg;
  const int64_t B = B_, T = T_, C = cfg.d_model;
  const int last_block = static_cast<int>(cfg.n_layers) + 1;
  if (chunk_has_head(chunk)) {
    if (hooks_) hooks_->before_backward(last_block);
    ops::linear_backward(Tensor(), gw_.head, Tensor(), a.logits, a.xf, w_.head, compute_);
    ops::add_inplace(gw_.norm_f_w, a.norm_f_stash.rows(0, 1).view({C}));
    if (gw_.norm_f_b.defined()) ops::add_inplace(gw_.norm_f_b, a.norm_f_stash.rows(1, 2).view({C}));
    if (hooks_) hooks_->after_backward(last_block);
  }
  const int64_t first = chunk_first_[chunk];
  for (int64_t j = chunk_first_[chunk + 1] - first - 1; j >= 0; --j)
    layer_backward_weight(first + j, a.layers[j], a.stash[j]);
  if (chunk != 0) return;
  if (!chunk_has_embedding(chunk)) {
    root_hooks();
    return;
  }
  if (hooks_) hooks_->before_backward(0);
  if (tp_.size() == 1) {
    ops::embedding_backward(gw_.wte, gw_.wpe, a.d_emb.view({B, T, C}), tokens);
  } else {
    Tensor d_emb = sp_ ? row_output_grad(a.d_emb) : a.d_emb;
    ops::embedding_backward(gw_.wte, gw_.wpe, d_emb.view({B, T, C}), tokens, 0, vocab_start_,
                            cfg.vocab_size);
  }
  if (hooks_) hooks_->after_backward(0);
}

void Transformer::root_hooks() {
  // A later pipeline stage holding the head (and a tied copy of wte): the root's gradients are
  // complete (ModelHooks).
  const int last_block = static_cast<int>(spec_.cfg.n_layers) + 1;
  const auto [root_first, root_last] = block_params(0);
  const auto [head_first, head_last] = block_params(last_block);
  if (hooks_ && (root_last > root_first || head_last > head_first)) {
    hooks_->before_backward(0);
    hooks_->after_backward(0);
  }
}

void Transformer::backward(int chunk, Acts& acts, Tensor tokens, const StepContext& ctx) {
  const auto& cfg = spec_.cfg;
  const int64_t B = B_, T = T_, C = cfg.d_model;
  const int last_block = static_cast<int>(cfg.n_layers) + 1;
  if (chunk_has_head(chunk)) {
    if (hooks_) hooks_->before_backward(last_block);
    ops::linear_backward(d_c_, gw_.head, Tensor(), acts.logits, acts.xf, w_.head, compute_);
    lowp(d_c_);
    norm_backward(d_res_, gw_.norm_f_w, gw_.norm_f_b, column_input_grad(d_c_), acts.out,
                  w_.norm_f_w, acts.mean_f, acts.rstd_f);
    if (hooks_) hooks_->after_backward(last_block);
  }
  for (int64_t j = chunk_first_[chunk + 1] - chunk_first_[chunk] - 1; j >= 0; --j)
    layer_backward(chunk_first_[chunk] + j, acts.layers[j], ctx);
  if (chunk != 0) return;
  if (!chunk_has_embedding(chunk)) {
    root_hooks();
    return;
  }
  if (hooks_) hooks_->before_backward(0);
  if (tp_.size() == 1) {
    ops::embedding_backward(gw_.wte, gw_.wpe, d_res_.view({B, T, C}), tokens);
  } else {
    // Every rank has the whole (gathered, under SP) embedding gradient: its vocabulary rows go to
    // its wte shard, and all of it to wpe, whose gradient is thus the same on every rank.
    Tensor d_emb = sp_ ? row_output_grad(d_res_) : d_res_;
    ops::embedding_backward(gw_.wte, gw_.wpe, d_emb.view({B, T, C}), tokens, 0, vocab_start_,
                            cfg.vocab_size);
  }
  if (hooks_) hooks_->after_backward(0);
}

float Transformer::forward_backward(Tensor tokens, Tensor targets, float dloss,
                                    const StepContext& ctx) {
  LLMT_CHECK(whole_.buf.data(),
             "forward_backward needs the whole model; a pipeline stage runs "
             "forward_chunk/backward_chunk");
  float loss = forward(0, whole_, tokens, targets, dloss, ctx);
  backward(0, whole_, tokens, ctx);
  return loss;
}

float Transformer::forward_loss(Tensor tokens, Tensor targets, const StepContext& ctx) {
  LLMT_CHECK(whole_.buf.data(),
             "forward_loss needs the whole model; a pipeline stage runs "
             "forward_chunk");
  return forward(0, whole_, tokens, targets, 0.0f, ctx);
}

}  // namespace llmt
