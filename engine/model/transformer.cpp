// The transformer over its blocks (blocks.h): parameter storage and binding, the activation and
// stash layouts of each micro-batch, and the order blocks run in, with the hooks around them. The
// engine never touches tensor memory itself; it lays out buffers once and calls ops on views.
#include "engine/model/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/rng.h"
#include "kernels/ops.h"

namespace llmt {

Transformer::Transformer(const ModelSpec& spec, Allocator& alloc, int64_t micro_batch,
                         DType compute, ModelStorage storage, TensorParallel tp,
                         RecomputeOptions recompute, ContextParallel cp, Communicator* ep,
                         int64_t decode_len, Fp8Recipe fp8)
    : spec_(spec),
      alloc_(alloc),
      B_(decode_len > 0 ? 1 : micro_batch),
      T_(decode_len > 0 ? 1 : spec.cfg.seq_len / cp.size()),
      compute_(compute),
      storage_(storage),
      seq_(zigzag_shard(T_ * cp.size(), cp.size(), cp.rank())),
      attention_(decode_len > 0
                     ? std::make_unique<KvCacheAttention>(
                           alloc, static_cast<int64_t>(spec.layers().size()), decode_len,
                           spec.cfg.n_heads / tp.size(), spec.n_kv_heads / tp.size(), spec.head_dim)
                     : make_attention_core(cp, alloc, micro_batch, spec.cfg.seq_len,
                                           spec_.cfg.n_heads / tp.size(),
                                           spec_.n_kv_heads / tp.size(), spec_.head_dim, compute)),
      env_{spec_, alloc_, B_, T_, tp_, views_, scratch_, seq_, *attention_, moe_stats_, ep} {
  for (size_t i = 0; i < spec_.params.size(); ++i)
    env_.index.emplace(spec_.params[i].name, static_cast<int64_t>(i));
  if (decode_len > 0) {
    LLMT_CHECK(cp.size() == 1 && !tp.sequence_parallel && spec.chunks.size() == 1 &&
                   spec.has_embedding && spec.has_head,
               "decoding runs the whole model, without cp, pp or sequence parallelism");
    decoder_ = static_cast<KvCacheAttention*>(attention_.get());
  }
  if (cp.size() > 1) env_.cp = cp.comm;
  // YaRN with mscale_all_dim (DeepSeek-V2/V3) scales the scores by m^2 / sqrt(D); otherwise the
  // core keeps its 1/sqrt(D).
  const double softmax_factor = kernel_math::rope_softmax_factor(spec_.cfg.rope_scaling);
  if (softmax_factor != 1.0)
    attention_->set_scale(
        static_cast<float>(softmax_factor / std::sqrt(static_cast<double>(spec_.head_dim))));
  LLMT_CHECK(ep == nullptr || ep->size() == spec_.ep_size, "the expert group has ", ep->size(),
             " ranks, the spec is sharded for ep=", spec_.ep_size);
  LLMT_CHECK(compute == DType::f32 || compute == DType::bf16 || compute == DType::f16,
             "compute type ", dtype_name(compute));
  LLMT_CHECK(spec_.tp_size == tp.size() && spec_.tp_rank == tp.rank(), "the model spec is for tp ",
             "rank ", spec_.tp_rank, " of ", spec_.tp_size, ", the tp group has rank ", tp.rank(),
             " of ", tp.size());
  LLMT_CHECK(recompute.layers >= 0, "recompute layers ", recompute.layers, " must be >= 0");
  const auto& cfg = spec_.cfg;
  const int p = tp.size();
  const int64_t N = B_ * T_, C = cfg.d_model;
  tp_.tp = tp;
  tp_.compute = compute_;
  LLMT_CHECK(!fp8.on() || fp8.block >= 1, "fp8 block ", fp8.block, " must be >= 1");
  tp_.fp8 = fp8;
  tp_.N = N;
  tp_.R = N;
  if (tp_.sp()) {
    LLMT_CHECK(N % p == 0, "sequence parallel: the micro-batch's ", B_, "x", T_,
               " tokens are not divisible by tp=", p);
    tp_.R = N / p;
    tp_.row0 = tp.rank() * tp_.R;
  }
  const int64_t R = tp_.R;

  // Parameters and gradients: one flat buffer each, views in spec order (views without memory
  // for what ModelStorage leaves to the caller, until bind_block).
  const int64_t P = spec_.num_local_params();
  // The model's own weights: fp32 masters, or (ModelStorage::master false: ZeRO-1/2 keep the
  // masters' rows) the compute weights, stored in the compute type.
  const DType own = storage_.master ? DType::f32 : compute_;
  if (storage_.params) {
    params_buf_ = alloc_.allocate(static_cast<size_t>(P) * dtype_size(own), MemCategory::params);
    flat_params_ = params_buf_.tensor({P}, own);
    // 16-bit: the compute copy of the fp32 masters, stored in the compute type.
    if (compute_ != DType::f32 && storage_.master)
      compute_buf_ =
          alloc_.allocate(static_cast<size_t>(P) * dtype_size(compute_), MemCategory::params);
  }
  const DType gt = storage_.grad_dtype;
  LLMT_CHECK(gt == DType::f32 || gt == compute_, "gradients of type ", dtype_name(gt),
             " with compute type ", dtype_name(compute_), ": f32 or the compute type");
  if (storage_.grads) {
    grads_buf_ = alloc_.allocate(static_cast<size_t>(P) * dtype_size(gt), MemCategory::grads);
    flat_grads_ = grads_buf_.tensor({P}, gt);
  }
  size_t off = 0;
  for (size_t i = 0; i < spec_.params.size(); ++i) {
    const Shape& shape = spec_.params[i].shape;  // this tp rank's
    params_.push_back(storage_.params ? params_buf_.tensor(shape, own, off / 4 * dtype_size(own))
                                      : Tensor(nullptr, shape, DType::f32, alloc_.device()));
    views_.g.push_back(storage_.grads ? grads_buf_.tensor(shape, gt, off / 4 * dtype_size(gt))
                                      : Tensor(nullptr, shape, gt, alloc_.device()));
    views_.w.push_back(compute_buf_.data()
                           ? compute_buf_.tensor(shape, compute_, off / 4 * dtype_size(compute_))
                           : params_.back());
    off += static_cast<size_t>(shape.numel()) * 4;
  }
  // Block boundaries: spec order is wte, [wpe], layers..., norm_f, [lm_head] (a pipeline stage
  // holds a subsequence; its other blocks are empty).
  const int64_t L = cfg.n_layers;
  auto block_of = [&](const ParamSpec& p) -> int64_t {
    if (p.layer >= 0) return p.layer + 1;
    return p.kind == ParamKind::embedding || p.kind == ParamKind::position ? 0 : L + 1;
  };
  for (int64_t b = 0, i = 0; b <= L + 2; ++b) {
    while (i < static_cast<int64_t>(spec_.params.size()) && block_of(spec_.params[i]) < b) ++i;
    block_first_.push_back(static_cast<size_t>(i));
  }
  layers_ = spec_.layers();
  chunk_first_.push_back(0);
  for (const auto& [b, e] : spec_.chunks) chunk_first_.push_back(chunk_first_.back() + (e - b));
  // Each layer's recompute mode: the first recompute.layers of its chunk (0: all).
  const LayerRecompute chosen{recompute.mode, recompute.modules};
  std::vector<LayerRecompute> modes;
  for (int c = 0; c < num_chunks(); ++c)
    for (int64_t j = 0; j < chunk_layers(c); ++j)
      modes.push_back(recompute.layers == 0 || j < recompute.layers ? chosen : LayerRecompute{});
  // The multi-token prediction modules' layers (with the head; none when decoding) recompute
  // as train.recompute says when it covers every layer (recompute.layers 0), else nothing.
  const bool with_mtp = spec_.has_head && decode_len == 0 && cfg.mtp_depth > 0;
  const std::vector<int64_t> mtp_layers = with_mtp ? spec_.mtp_layers() : std::vector<int64_t>{};
  const LayerRecompute mtp_mode = recompute.layers == 0 ? chosen : LayerRecompute{};
  // What the recompute scratch holds: the attention core, a norm's output, an activation's.
  const bool any_selective =
      std::any_of(modes.begin(), modes.end(),
                  [](const LayerRecompute& m) { return m.mode == Recompute::selective; }) ||
      (with_mtp && mtp_mode.mode == Recompute::selective);
  const RecomputeModules& modules = recompute.modules;
  distribute_ = recompute.distribute;
  LLMT_CHECK(!distribute_ || (recompute.mode == Recompute::full && p > 1 && !tp_.sp() &&
                              decode_len == 0 && (R * C) % p == 0),
             "distributed saved activations need full recompute under tp > 1 without sequence "
             "parallelism, and no decoding (tp=",
             p, tp_.sp() ? " with sp" : "",
             recompute.mode == Recompute::full ? ", full recompute" : ", not full recompute",
             decode_len > 0 ? ", decoding" : "", ")");
  for (int c = 0; c < num_chunks(); ++c)
    LLMT_CHECK(!distribute_ || chunk_layers(c) > 0, "distributed saved activations: model chunk ",
               c, " has no layers (its input and output would be the same tensor)");
  // The layers' shapes: one kind for dense layers and one for mixture-of-experts layers
  // (LayerKind), each with its full saved set, whether a layer of it recomputes fully, and its
  // stash.
  moe_stats_.load.resize(static_cast<size_t>(L + cfg.mtp_depth));
  bool has_moe = false;
  std::array<std::vector<TensorSpec>, 2> layer_full;
  std::array<std::vector<TensorSpec>, 2> layer_stash;
  std::array<bool, 2> full_of{false, false};
  std::vector<std::pair<int64_t, LayerRecompute>> all_layers;  // (global layer, mode)
  for (size_t j = 0; j < layers_.size(); ++j) all_layers.emplace_back(layers_[j], modes[j]);
  for (const int64_t l : mtp_layers) all_layers.emplace_back(l, mtp_mode);
  for (const auto& [l, mode] : all_layers) {
    const int kind = cfg.moe.layer(l) ? 1 : 0;
    has_moe = has_moe || kind == 1;
    full_of[kind] = full_of[kind] || mode.mode == Recompute::full;
    if (!layer_full[kind].empty()) continue;
    const Layer probe(env_, l, LayerRecompute{}, {});
    layer_full[kind] = probe.full_saved();
    layer_stash[kind] = probe.stash();
  }
  const Embedding emb_probe(env_);
  const std::vector<TensorSpec> emb_stash = emb_probe.stash();
  std::vector<TensorSpec> head_stash;
  if (spec_.has_head) {
    const Norm norm_f(env_, "norm_f");
    head_stash = norm_f.stash();
  }
  // The non-view entries of a back-to-back backward's stash: one block's at a time.
  auto made = [](const std::vector<TensorSpec>& specs) {
    std::vector<TensorSpec> out;
    for (const TensorSpec& t : specs)
      if (!t.view) out.push_back(t);
    return out;
  };
  // Each multi-token prediction module's stash (the same whatever its layer recomputes).
  std::vector<std::vector<TensorSpec>> mtp_stash;
  for (int64_t k = 1; k <= static_cast<int64_t>(mtp_layers.size()); ++k)
    mtp_stash.push_back(MtpModule(env_, k, LayerRecompute{}, {}, Tensor(), Tensor()).stash());
  size_t stash_bytes = std::max({spec_bytes(made(layer_stash[0])), spec_bytes(made(layer_stash[1])),
                                 spec_bytes(made(head_stash))});
  for (const auto& m : mtp_stash) stash_bytes = std::max(stash_bytes, spec_bytes(made(m)));

  // Scratch shared by every micro-batch: lay out twice (count, then carve).
  const int64_t H = cfg.n_heads / p, KV = spec_.n_kv_heads / p, D = spec_.head_dim;
  Tensor ce_max, ce_sums;
  auto carve = [&](TensorLayout& lay) {
    if (p > 1) {
      ce_max = lay.take({N});
      ce_sums = lay.take({2, N});
    }
    BlockScratch& sc = scratch_;
    sc.d_res = lay.take({R, C});
    sc.d_tmp = lay.take({R, C});
    sc.d_c = lay.take({N, C});
    sc.d_qkv = lay.take({B_, T_, H + 2 * KV, D});
    sc.d_att = lay.take({B_, T_, H, D});
    // The widest MLP's: the dense one or an MoE layer's shared experts.
    sc.d_u = lay.take({B_, T_, std::max(spec_.fc1_out, spec_.shared_fc1_out) / p});
    sc.d_g = lay.take({B_, T_, std::max(spec_.ffn_dim, spec_.shared_ffn) / p});
    if (has_moe) {
      // The rows the MoE layers route on this rank (all N, or R under sequence parallelism).
      const MoeRows mr = moe_rows(tp_, T_);
      const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k, M = mr.R * k;
      sc.moe_scores = lay.take({mr.R, E});
      sc.moe_y = lay.take({mr.R, C});
      sc.moe_dx = lay.take({mr.R, C});
      sc.moe_dx_router = lay.take({mr.R, C});
      sc.moe_dw = lay.take({mr.R, k});
      sc.moe_dg = lay.take({M, cfg.moe.d_ff_expert});
      sc.moe_dxp = lay.take({M, C});
      sc.moe_aux = lay.take({mr.segments});
      sc.moe_zsq = lay.take({mr.R});
    }
    if (cfg.mla_attention()) {
      // Latent attention's (BlockScratch::Mla).
      const MlaConfig& a = cfg.mla;
      const int64_t Cq = a.q_lora_rank, Ckv = a.kv_lora_rank, Dr = a.qk_rope_head_dim;
      const int64_t widest = std::max({Cq, Ckv, Dr});
      BlockScratch::Mla& m = sc.mla;
      m.kv = lay.take({N, H * (a.qk_nope_head_dim + a.v_head_dim)});
      m.k_pe = lay.take({N, Dr}, compute_);
      if (tp_.sp()) m.rows = lay.take({R, widest}, compute_);
      m.kva = lay.take({R, Ckv + Dr});
      m.d_kva = lay.take({R, Ckv + Dr});
      m.d_lat = lay.take({N, std::max(Cq, Ckv)});
      m.d_kpe = lay.take({N, Dr});
      m.d_rows = lay.take({R, widest});
      if (Cq > 0) m.d_qa = lay.take({R, Cq});
      m.dx = lay.take({R, C});
    }
    if (with_mtp) {
      sc.mtp.x = lay.take({R, C});
      sc.mtp.d_cat = lay.take({R, 2 * C});
      sc.mtp.carry = lay.take({R, C});
    }
    tp_.full = lay.take({N, C});
    if (tp_.sp()) {
      tp_.gathered = lay.take({N, C}, compute_);  // the layers' norm outputs, gathered
      tp_.shard = lay.take({R, C});
    }
    if (tp_.fp8.on()) {
      // The FP8 inputs of the layers' linears and, routed here (without ep), the experts'
      // grouped GEMMs (TpLayers): every dense GEMM has N rows, the experts' at most the routed
      // rows' k assignments each; features and weights are at most this rank's widest and
      // largest layer weight (an expert stack whole: its experts are quantised one by one).
      int64_t width = 1, numel = 1, rows = N;
      for (const ParamSpec& ps : spec_.params) {
        if ((ps.layer < 0 && !ps.mtp) || ps.shape.ndim() < 2) continue;
        const int d = ps.shape.ndim();
        width = std::max({width, ps.shape[d - 2], ps.shape[d - 1]});
        numel = std::max(numel, ps.shape.numel());
      }
      if (has_moe && (ep == nullptr || ep->size() == 1))
        rows = std::max(rows, moe_rows(tp_, T_).R * cfg.moe.top_k);
      tp_.fp8_a = lay.take({rows * width});
      tp_.fp8_b = lay.take({rows * width});
      tp_.fp8_w = lay.take({numel});
      tp_.fp8_amax = lay.take({fp8_amax_size(tp_.fp8, std::max(rows, width), width)});
    }
    sc.stash = lay.take({static_cast<int64_t>(stash_bytes / 4)});
    const size_t before = lay.bytes();
    if (any_selective && modules.core_attn()) {
      sc.core_att = lay.take({B_, T_, H, D});
      sc.core_lse = lay.take({B_, H, T_});
    }
    if (any_selective && modules.layernorm()) sc.norm_out = lay.take({R, C}, compute_);
    if (any_selective && modules.act())
      sc.act_out = lay.take({B_, T_, std::max(spec_.ffn_dim, spec_.shared_ffn) / p}, compute_);
    // The routed experts' activation of one MoE layer's rows (under ep each layer allocates it
    // for its received rows: ep_act_specs).
    if (any_selective && modules.moe_act() && has_moe && (ep == nullptr || ep->size() == 1))
      sc.moe_act_out =
          lay.take({moe_rows(tp_, T_).R * cfg.moe.top_k, cfg.moe.d_ff_expert}, compute_);
    // Latent attention's core input, rebuilt from the latents (H, D: the core's heads).
    if (any_selective && modules.mla_up_proj() && cfg.mla_attention())
      sc.mla.qkv = lay.take({B_, T_, LatentAttention::core_heads(*attention_, H), D}, compute_);
    for (int kind = 0; kind < 2; ++kind) {
      if (!full_of[kind]) continue;
      // One layer's full saved set but its input: a replay reads the layer's own saved input.
      std::vector<Tensor>& set = replay_sets_[static_cast<size_t>(kind)];
      set.assign(1, Tensor());
      const std::vector<TensorSpec>& f = layer_full[static_cast<size_t>(kind)];
      for (const Tensor& t : lay.take_all({f.begin() + 1, f.end()})) set.push_back(t);
    }
    if (full_of[0] || full_of[1]) sc.replay_out = lay.take({R, C});
    if (distribute_)
      for (Tensor& w : sc.whole) w = lay.take({R, C}, compute_);
    recompute_scratch_bytes_ = lay.bytes() - before;
  };
  TensorLayout count;
  carve(count);
  scratch_buf_ = alloc_.allocate(count.bytes(), MemCategory::activations);
  TensorLayout real(scratch_buf_.tensor({static_cast<int64_t>(count.bytes() / 4)}, DType::f32));
  carve(real);
  // Back-to-back stashes: the non-view entries in scratch.stash (one block's at a time).
  auto fused = [&](const std::vector<TensorSpec>& specs) {
    std::vector<Tensor> out;
    TensorLayout lay(scratch_.stash);
    for (const TensorSpec& t : specs) out.push_back(t.view ? Tensor() : lay.take(t.shape, t.dtype));
    return out;
  };
  for (int kind = 0; kind < 2; ++kind) layer_stash_[kind] = fused(layer_stash[kind]);
  head_stash_ = fused(head_stash);
  emb_stash_ = fused(emb_stash);
  for (const auto& m : mtp_stash) mtp_stash_.push_back(fused(m));

  // The blocks.
  if (spec_.has_embedding) embedding_.emplace(env_);
  for (size_t j = 0; j < layers_.size(); ++j) {
    std::vector<Tensor>& replay = replay_sets_[cfg.moe.layer(layers_[j]) ? 1 : 0];
    layer_blocks_.push_back(std::make_unique<Layer>(
        env_, layers_[j], modes[j],
        modes[j].mode == Recompute::full ? std::span<Tensor>(replay) : std::span<Tensor>(),
        distribute_ && modes[j].mode == Recompute::full));
  }
  if (spec_.has_head) head_.emplace(env_, ce_max, ce_sums, /*f32_logits=*/decode_len > 0);
  for (const int64_t l : mtp_layers) {
    std::vector<Tensor>& replay = replay_sets_[cfg.moe.layer(l) ? 1 : 0];
    mtp_.push_back(std::make_unique<MtpModule>(
        env_, l - L + 1, mtp_mode,
        mtp_mode.mode == Recompute::full ? std::span<Tensor>(replay) : std::span<Tensor>(), ce_max,
        ce_sums));
  }

  if (num_chunks() == 1 && spec_.has_embedding && spec_.has_head) {
    // The whole model: one micro-batch's activations, kept for the model's lifetime.
    TensorLayout acount;
    carve_acts(acount, whole_, 0);
    whole_.buf = alloc_.allocate(acount.bytes(), MemCategory::activations);
    TensorLayout areal(whole_.buf.tensor({static_cast<int64_t>(acount.bytes() / 4)}, DType::f32));
    carve_acts(areal, whole_, 0);
  } else {
    pipe_acts_.resize(spec_.chunks.size());
  }
}

std::vector<TensorSpec> Transformer::layer_saved(int64_t local) const {
  LLMT_CHECK(local >= 0 && local < static_cast<int64_t>(layer_blocks_.size()), "local layer ",
             local, " of ", layer_blocks_.size());
  return layer_blocks_[static_cast<size_t>(local)]->saved();
}

void Transformer::carve_acts(TensorLayout& lay, Acts& a, int chunk) const {
  a.layers.clear();
  for (int64_t j = chunk_first_[chunk]; j < chunk_first_[chunk + 1]; ++j)
    a.layers.push_back(lay.take_all(layer_blocks_[static_cast<size_t>(j)]->saved()));
  // The next layer's res_in: (R,C), or this rank's part of it (R*C/tp) where it is sent to a
  // stage that saves only that.
  const int64_t R = tp_.R, C = spec_.cfg.d_model;
  a.out = lay.take(out_distributed(chunk) ? Shape{R * C / tp_.tp.size()} : Shape{R, C}, compute_);
  if (chunk_has_head(chunk)) a.head = lay.take_all(head_->saved());
  a.mtp.clear();
  if (chunk_has_head(chunk))
    for (const auto& m : mtp_) a.mtp.push_back(lay.take_all(m->saved()));
}

void Transformer::carve_stash(TensorLayout& lay, Acts& a, int chunk) const {
  a.layer_stash.clear();
  for (int64_t j = chunk_first_[chunk]; j < chunk_first_[chunk + 1]; ++j)
    a.layer_stash.push_back(lay.take_all(layer_blocks_[static_cast<size_t>(j)]->stash()));
  if (chunk_has_head(chunk)) a.head_stash = lay.take_all(head_->stash());
  a.mtp_stash.clear();
  if (chunk_has_head(chunk))
    for (const auto& m : mtp_) a.mtp_stash.push_back(lay.take_all(m->stash()));
  if (chunk_has_embedding(chunk)) a.emb_stash = lay.take_all(embedding_->stash());
}

Transformer::Acts& Transformer::acts_of(int chunk, int mb) {
  LLMT_CHECK(chunk >= 0 && chunk < num_chunks() && mb >= 0, "chunk ", chunk, " of ", num_chunks(),
             ", micro-batch ", mb);
  LLMT_CHECK(!pipe_acts_.empty(), "the pipeline API needs a pipeline-stage spec (shard_pp)");
  std::vector<Acts>& per_mb = pipe_acts_[static_cast<size_t>(chunk)];
  if (per_mb.size() <= static_cast<size_t>(mb)) per_mb.resize(static_cast<size_t>(mb) + 1);
  Acts& a = per_mb[static_cast<size_t>(mb)];
  if (!a.buf.data()) {
    TensorLayout count;
    carve_acts(count, a, chunk);
    a.buf = alloc_.allocate(count.bytes(), MemCategory::activations);
    TensorLayout real(a.buf.tensor({static_cast<int64_t>(count.bytes() / 4)}, DType::f32));
    carve_acts(real, a, chunk);
  }
  return a;
}

size_t Transformer::chunk_activation_bytes(int chunk) const {
  TensorLayout count;
  Acts a;
  carve_acts(count, a, chunk);
  return count.bytes();
}

size_t Transformer::chunk_stash_bytes(int chunk) const {
  TensorLayout count;
  Acts a;
  carve_stash(count, a, chunk);
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
    LLMT_CHECK(dout.defined() && dout.shape == scratch_.d_res.shape, "backward_chunk(", chunk, ", ",
               mb, "): the output gradient must be ", scratch_.d_res.shape.str());
    ops::copy(scratch_.d_res, dout);
  }
  backward(chunk, a, tokens, ctx, true);
  return chunk_has_embedding(chunk) ? Tensor() : scratch_.d_res;
}

Tensor Transformer::backward_input_chunk(int chunk, int mb, Tensor dout, const StepContext& ctx) {
  Acts& a = acts_of(chunk, mb);
  TensorLayout count;
  carve_stash(count, a, chunk);
  a.stash_buf = alloc_.allocate(count.bytes(), MemCategory::activations);
  TensorLayout real(a.stash_buf.tensor({static_cast<int64_t>(count.bytes() / 4)}, DType::f32));
  carve_stash(real, a, chunk);
  if (!chunk_has_head(chunk)) {
    LLMT_CHECK(dout.defined() && dout.shape == scratch_.d_res.shape, "backward_input_chunk(", chunk,
               ", ", mb, "): the output gradient must be ", scratch_.d_res.shape.str());
    ops::copy(scratch_.d_res, dout);
  }
  backward(chunk, a, Tensor(), ctx, false);
  return chunk_has_embedding(chunk) ? Tensor() : scratch_.d_res;
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
      views_.w[i] = Tensor(static_cast<char*>(weights.data) + off * dtype_size(weights.dtype),
                           shape, weights.dtype, weights.device);
      params_[i] = views_.w[i];
    }
    if (grads.defined()) {
      LLMT_CHECK(off + n <= grads.numel(), "bind_block(", block, "): grads ", describe(grads),
                 " too small");
      views_.g[i] = Tensor(static_cast<char*>(grads.data) + off * dtype_size(grads.dtype), shape,
                           grads.dtype, grads.device);
    }
    off += n;
  }
}

void init_param_rows(const ModelSpec& spec, size_t i, Tensor x, int64_t row_begin, uint64_t seed) {
  const ParamSpec& p = spec.params[i];
  // Rows of dim 0, or of ModelSpec::cut_rows (an expert stack's experts x their first dim: x is
  // then 2-D, its rows cut rows).
  const bool cut = x.ndim() == 2 && p.shape.ndim() > 2;
  const int64_t rows = cut ? spec.cut_rows(i) : p.shape[0];
  LLMT_CHECK(
      (cut || x.ndim() == p.shape.ndim()) && row_begin >= 0 && row_begin + x.shape[0] <= rows,
      p.name, ": rows [", row_begin, ", ", row_begin + x.shape[0], ") of ", rows, " (",
      p.shape.str(), ")");
  if (p.init != InitKind::normal) {
    ops::fill(x, p.init == InitKind::ones ? 1.0f : 0.0f);
    return;
  }
  const uint64_t stream = rng::hash_name(p.name);
  const Shape& g = p.global_shape;
  const int64_t row = g.numel() / g[0];  // global elements per dim-0 index
  if (!p.on(Axis::tp).sharded() || spec.tp_size == 1) {
    // Whole, or (expert parallelism) a run of whole experts from the rank's first one.
    const int64_t first = spec.local_slices(i).front().global_start;
    const int64_t per_row = p.shape.numel() / rows;  // elements of one of x's rows
    ops::init_normal(x, p.std, seed, stream, first * row + row_begin * per_row);
    return;
  }
  LLMT_CHECK(!cut, p.name, ": cut rows of a tp-sharded parameter");
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
                 p.name, ": only one column slice of a 2-D tensor is supported, got ",
                 p.on(Axis::tp).str());
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
  // Without masters the weights are stored in the compute type: nothing to refresh.
  if (compute_ == DType::f32 || !storage_.params || !storage_.master) return;
  ops::convert(compute_buf_.tensor(flat_params_.shape, compute_), flat_params_);
}

void Transformer::zero_grads() {
  if (storage_.grads) ops::fill_zero(flat_grads_);
}

bool Transformer::is_bt(const Tensor& t) const {
  return t.ndim() == 2 && t.shape[0] == B_ && t.shape[1] == T_;
}

void Transformer::forward_layers(int chunk, Acts& acts, Tensor tokens, const StepContext& ctx) {
  const int64_t first = chunk_first_[chunk], n = chunk_layers(chunk);
  // Distributed saved inputs: where a layer saves (or the chunk sends) only this rank's part of
  // the residual stream, the stream passes whole between scratch.whole[0] and [1]; `whole` holds
  // the next layer's input, k its buffer.
  Tensor whole;
  int k = 0;
  auto is_part = [&](int64_t j) {
    return j < n ? layer_blocks_[static_cast<size_t>(first + j)]->distributed()
                 : out_distributed(chunk);
  };
  auto slot_of = [&](int64_t j) {
    return j < n ? acts.layers[static_cast<size_t>(j)][0] : acts.out;
  };
  // Where the producer of layer j's input (the embedding, or layer j-1) writes it.
  auto destination = [&](int64_t j) {
    if (!is_part(j)) return slot_of(j);
    scratch_.replay_of = nullptr;  // the replay set may hold this buffer as its input
    k = whole.defined() ? 1 - k : 0;
    return scratch_.whole[static_cast<size_t>(k)];
  };
  auto produced = [&](int64_t j, Tensor x) {
    whole = Tensor();
    if (!is_part(j)) return;
    tp::split_1d(*tp_.tp.comm, slot_of(j), x);
    whole = x;
  };
  if (chunk_has_embedding(chunk)) {
    LLMT_CHECK(is_bt(tokens), "tokens ", tokens.shape.str(), " must be (", B_, ", ", T_, ")");
    if (hooks_) hooks_->before_forward(0);
    const Tensor x = destination(0);
    embedding_->forward(x, tokens);
    produced(0, x);
  } else if (is_part(0)) {
    // A received part: the whole input, gathered over tp.
    whole = destination(0);
    tp::gather_1d(*tp_.tp.comm, whole, slot_of(0));
  }
  for (int64_t j = 0; j < n; ++j) {
    Layer& layer = *layer_blocks_[static_cast<size_t>(first + j)];
    if (hooks_) hooks_->before_forward(static_cast<int>(layer.index()) + 1);
    const Tensor in = is_part(j) ? whole : slot_of(j), out = destination(j + 1);
    layer.forward(acts.layers[static_cast<size_t>(j)], in, out, ctx);
    produced(j + 1, out);
  }
}

float Transformer::forward(int chunk, Acts& acts, Tensor tokens, Tensor targets, float dloss,
                           const StepContext& ctx) {
  if (dloss != 0.0f) moe_stats_.dloss = dloss;  // the MoE losses' gradient scale
  moe_stats_.forward_only = dloss == 0.0f;      // evaluation (forward_loss, pipeline eval)
  forward_layers(chunk, acts, tokens, ctx);
  if (!chunk_has_head(chunk)) return 0.0f;
  if (hooks_) hooks_->before_forward(static_cast<int>(spec_.cfg.n_layers) + 1);
  const float loss = head_->forward(acts.head, acts.out, target_plane(targets, 0), dloss);
  if (!mtp_.empty() && dloss != 0.0f) mtp_forward(acts, targets, dloss, ctx);
  return loss;
}

Tensor Transformer::target_plane(Tensor targets, int64_t j) const {
  if (j == 0 && is_bt(targets)) return targets;
  const int64_t D = static_cast<int64_t>(mtp_.size());
  LLMT_CHECK(targets.ndim() == 3 && targets.shape[0] == 1 + 2 * D && targets.shape[1] == B_ &&
                 targets.shape[2] == T_,
             "targets ", targets.shape.str(), " must be (", B_, ", ", T_, ")",
             D > 0 ? detail::concat(", or with model.mtp_depth=", D, " (", 1 + 2 * D, ", ", B_,
                                    ", ", T_, "): the targets, then each depth's inputs and labels")
                   : std::string());
  return targets.rows(j, j + 1).view({B_, T_});
}

void Transformer::mtp_forward(Acts& a, Tensor targets, float dloss, const StepContext& ctx) {
  // Each depth's loss joins the objective with weight mtp_loss_weight / D.
  const int64_t D = static_cast<int64_t>(mtp_.size());
  const float d_mtp = dloss * spec_.cfg.mtp_loss_weight / static_cast<float>(D);
  double sum = 0;
  Tensor h = head_->normed(a.head);
  for (int64_t k = 1; k <= D; ++k) {
    MtpModule& m = *mtp_[static_cast<size_t>(k - 1)];
    const std::vector<Tensor>& s = a.mtp[static_cast<size_t>(k - 1)];
    sum +=
        m.forward(s, h, target_plane(targets, 2 * k - 1), target_plane(targets, 2 * k), d_mtp, ctx);
    h = m.out(s);
  }
  mtp_loss_sum_ += sum / static_cast<double>(D);
}

void Transformer::mtp_backward(Acts& a, const StepContext& ctx, bool then_weight) {
  for (int64_t k = static_cast<int64_t>(mtp_.size()); k >= 1; --k) {
    const size_t i = static_cast<size_t>(k - 1);
    Stash st(then_weight ? std::span<Tensor>(mtp_stash_[i]) : std::span<Tensor>(a.mtp_stash[i]),
             !then_weight);
    const Tensor h = k == 1 ? head_->normed(a.head) : mtp_[i - 1]->out(a.mtp[i - 1]);
    mtp_[i]->backward_input(a.mtp[i], st, h, k < static_cast<int64_t>(mtp_.size()), ctx,
                            then_weight);
  }
}

void Transformer::backward(int chunk, Acts& a, Tensor tokens, const StepContext& ctx,
                           bool then_weight) {
  // Hooks come with the weight part (DDP/ZeRO reduce the gradients it completes).
  auto hook = [&](bool before, int block) {
    if (!hooks_ || !then_weight) return;
    if (before)
      hooks_->before_backward(block);
    else
      hooks_->after_backward(block);
  };
  const int last_block = static_cast<int>(spec_.cfg.n_layers) + 1;
  if (chunk_has_head(chunk)) {
    Stash st(then_weight ? std::span<Tensor>(head_stash_) : std::span<Tensor>(a.head_stash),
             !then_weight);
    hook(true, last_block);
    if (!mtp_.empty()) mtp_backward(a, ctx, then_weight);
    // The final norm's output feeds depth 1's hnorm too.
    head_->backward_input(a.head, st, a.out, mtp_.empty() ? Tensor() : scratch_.mtp.carry);
    if (then_weight) head_->backward_weight(a.head, st);
    hook(false, last_block);
  }
  const int64_t first = chunk_first_[chunk];
  for (int64_t j = chunk_layers(chunk) - 1; j >= 0; --j) {
    Layer& layer = *layer_blocks_[static_cast<size_t>(first + j)];
    Stash st(then_weight
                 ? std::span<Tensor>(layer_stash_[spec_.cfg.moe.layer(layer.index()) ? 1 : 0])
                 : std::span<Tensor>(a.layer_stash[static_cast<size_t>(j)]),
             !then_weight);
    hook(true, static_cast<int>(layer.index()) + 1);
    layer.backward_input(a.layers[static_cast<size_t>(j)], st, ctx, then_weight);
    hook(false, static_cast<int>(layer.index()) + 1);
  }
  if (chunk != 0) return;
  if (!chunk_has_embedding(chunk)) {
    if (then_weight) root_hooks();
    return;
  }
  Stash st(then_weight ? std::span<Tensor>(emb_stash_) : std::span<Tensor>(a.emb_stash),
           !then_weight);
  embedding_->backward_input(st, scratch_.d_res);
  if (!then_weight) return;
  hook(true, 0);
  embedding_->backward_weight(st, tokens);
  hook(false, 0);
}

void Transformer::backward_weight_chunk(int chunk, int mb, Tensor tokens, const StepContext& ctx) {
  Acts& a = acts_of(chunk, mb);
  LLMT_CHECK(a.stash_buf.data(), "backward_weight_chunk(", chunk, ", ", mb,
             ") before its backward_input_chunk");
  const int last_block = static_cast<int>(spec_.cfg.n_layers) + 1;
  if (chunk_has_head(chunk)) {
    if (hooks_) hooks_->before_backward(last_block);
    // In the order backward() adds them back to back: the deepest module first.
    for (size_t i = mtp_.size(); i-- > 0;)
      mtp_[i]->backward_weight(a.mtp[i], Stash(a.mtp_stash[i], true), ctx);
    head_->backward_weight(a.head, Stash(a.head_stash, true));
    if (hooks_) hooks_->after_backward(last_block);
  }
  const int64_t first = chunk_first_[chunk];
  for (int64_t j = chunk_layers(chunk) - 1; j >= 0; --j) {
    Layer& layer = *layer_blocks_[static_cast<size_t>(first + j)];
    if (hooks_) hooks_->before_backward(static_cast<int>(layer.index()) + 1);
    layer.backward_weight(a.layers[static_cast<size_t>(j)],
                          Stash(a.layer_stash[static_cast<size_t>(j)], true), ctx);
    if (hooks_) hooks_->after_backward(static_cast<int>(layer.index()) + 1);
  }
  if (chunk != 0) return;
  if (!chunk_has_embedding(chunk)) {
    root_hooks();
    return;
  }
  if (hooks_) hooks_->before_backward(0);
  embedding_->backward_weight(Stash(a.emb_stash, true), tokens);
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

float Transformer::forward_backward(Tensor tokens, Tensor targets, float dloss,
                                    const StepContext& ctx) {
  LLMT_CHECK(whole_.buf.data(),
             "forward_backward needs the whole model; a pipeline stage runs "
             "forward_chunk/backward_chunk");
  float loss = forward(0, whole_, tokens, targets, dloss, ctx);
  backward(0, whole_, tokens, ctx, true);
  return loss;
}

Tensor Transformer::forward_logits(Tensor tokens, const StepContext& ctx) {
  LLMT_CHECK(whole_.buf.data(), "forward_logits needs the whole model, not a pipeline stage");
  moe_stats_.forward_only = true;
  forward_layers(0, whole_, tokens, ctx);
  if (hooks_) hooks_->before_forward(static_cast<int>(spec_.cfg.n_layers) + 1);
  return head_->logits(whole_.head, whole_.out);
}

Tensor Transformer::decode(Tensor token, int64_t pos) {
  LLMT_CHECK(decoder_, "decode() needs a Transformer built with decode_len > 0");
  decoder_->start(pos);
  StepContext ctx;
  ctx.dropout = false;
  return forward_logits(token, ctx);
}

float Transformer::forward_loss(Tensor tokens, Tensor targets, const StepContext& ctx) {
  LLMT_CHECK(whole_.buf.data(),
             "forward_loss needs the whole model; a pipeline stage runs "
             "forward_chunk");
  return forward(0, whole_, tokens, targets, 0.0f, ctx);
}

}  // namespace llmt
