#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <numeric>

#include "checkpoints/layout.h"
#include "engine/data_parallel/data_parallel.h"
#include "engine/data_parallel/zero_layout.h"
#include "engine/data_parallel/zero_sequence.h"
#include "engine/model/blocks.h"
#include "engine/model/model_spec.h"
#include "engine/parallel/context_parallel.h"
#include "engine/pipeline/executor.h"
#include "engine/schedule/schedule.h"
#include "kernels/ops.h"
#include "train/rank_model.h"
#include "train/trainer.h"

namespace llmt {

namespace {

using detail::concat;

// The shapes of one rank's blocks (blocks.h): N positions of a micro-batch on this rank (B x T/cp),
// R of them in the residual stream (N/tp with sequence parallelism), local head and width counts.
struct Dims {
  double B, T, N, R, C, H, KV, D, F, F1, V;
  // Mixture of experts: E experts, k per token, an expert's hidden width Fe and fc1 rows Fe1,
  // the shared experts' Fs and Fs1 (0 without), and the expert parallel degree; the rows the
  // MoE layers route on the rank (R) in Sr segments (blocks.h, MoeRows).
  double E = 0, k = 0, Fe = 0, Fe1 = 0, Fs = 0, Fs1 = 0, ep = 1, Sr = 0;
};

// The peak of one rank's saved activations and zero-bubble stashes over its schedule's actions:
// a micro-batch's saved set lives from its forward to its (weight) backward, its stash from
// backward_input to backward_weight; a whole backward adds `whole_mb` for its moment (empty: none).
// `per_mb`, `stash_mb`, `whole_mb`: one micro-batch's, per chunk.
double schedule_activation_peak(const std::vector<Action>& actions,
                                const std::vector<double>& per_mb,
                                const std::vector<double>& stash_mb,
                                const std::vector<double>& whole_mb) {
  double live = 0, peak = 0;
  for (const Action& a : actions) {
    const double saved = per_mb[static_cast<size_t>(a.chunk)],
                 stash = stash_mb[static_cast<size_t>(a.chunk)];
    switch (a.kind) {
      case ActionKind::forward:
        live += saved;
        break;
      case ActionKind::backward_input:
        live += stash;
        break;
      case ActionKind::backward:
        if (!whole_mb.empty()) peak = std::max(peak, live + whole_mb[static_cast<size_t>(a.chunk)]);
        live -= saved;
        break;
      case ActionKind::backward_weight:
        live -= saved + stash;
        break;
      default:
        break;
    }
    peak = std::max(peak, live);
  }
  return peak;
}

// One micro-batch's forward and backward of every chunk of `model` (built on a meta device that
// reads zeros) under an ops::Recording: the bytes its ops move, as the trainer (no pp:
// forward_backward) or the pipeline executor (forward_chunk, backward_chunk) runs them.
// tokens (B, T/cp): a micro-batch of the rank's positions.
void record_step(Transformer& model, Allocator& alloc, const Shape& bt, bool pipeline,
                 RankActivations& out) {
  const ModelConfig& mc = model.spec().cfg;
  // With multi-token prediction the targets carry each depth's inputs and labels (TokenStaging).
  const Shape tt = mc.mtp_depth > 0 ? Shape({1 + 2 * mc.mtp_depth, bt[0], bt[1]}) : bt;
  Buffer tok = alloc.allocate_tensor(bt, DType::i32, MemCategory::other),
         tgt = alloc.allocate_tensor(tt, DType::i32, MemCategory::other),
         grad = alloc.allocate_tensor(model.activation_shape(), DType::f32, MemCategory::other);
  const Tensor tokens = tok.tensor(bt, DType::i32), targets = tgt.tensor(tt, DType::i32);
  // Weights and gradients the model does not own (ZeRO binds them to its units): meta buffers
  // of their types, as ZeRO's gathered units (the compute type) and staging hold them.
  std::vector<Buffer> bound;
  const ModelStorage& st = model.storage();
  if (!st.params || !st.grads) {
    for (int b = 0; b < model.num_blocks(); ++b) {
      const auto [first, last] = model.block_params(b);
      int64_t n = 0;
      for (size_t i = first; i < last; ++i) n += model.spec().params[i].shape.numel();
      if (n == 0) continue;
      Tensor w, g;
      if (!st.params) {
        bound.push_back(alloc.allocate_tensor({n}, model.compute_dtype(), MemCategory::other));
        w = bound.back().tensor({n}, model.compute_dtype());
      }
      if (!st.grads) {
        bound.push_back(alloc.allocate_tensor({n}, st.grad_dtype, MemCategory::other));
        g = bound.back().tensor({n}, st.grad_dtype);
      }
      model.bind_block(b, w, g);
    }
  }
  const StepContext ctx{.dropout = mc.dropout > 0};
  ops::OpTally tally;
  {
    const ops::Recording rec(tally);
    if (!pipeline) {
      model.forward_backward(tokens, targets, 1.0f, ctx);
    } else {
      const int v = model.num_chunks();
      for (int c = 0; c < v; ++c) {
        if (!model.chunk_has_embedding(c)) model.chunk_input(c, 0);
        model.forward_chunk(c, 0, tokens, targets, 1.0f, ctx);
      }
      for (int c = v - 1; c >= 0; --c) {
        model.backward_chunk(
            c, 0,
            model.chunk_has_head(c) ? Tensor() : grad.tensor(model.activation_shape(), DType::f32),
            tokens, ctx);
        model.free_chunk(c, 0);
      }
    }
  }
  out.matmul_bytes_mb = tally.matmul_bytes;
  out.other_bytes_mb = tally.other_bytes;
  out.rounding_bytes_mb = tally.rounding_bytes;
  out.other_by_op = std::move(tally.bytes);
}

// One rank's activation memory as its model lays it out: the model a run builds on that rank
// (make_rank_model), built on the meta device with groups of the mesh's shape, so the bytes are
// counted by the code that allocates them. Under ep each MoE layer adds, per micro-batch, the
// rows its rank receives for its experts (ep_rows_specs, R k rows at balanced routing) from its
// forward to its backward, their gradients from its input backward to its weight backward, and
// for a moment in its backward their input gradients; of the moe_full fully recomputed ones the
// rows only from their backward's start (MoeMlp dispatches them again there) to their weight
// backward; of the moe_act ones (selective recompute of the routed experts' activation) the rows
// without their activation, which lives only while fc2's forward or weight gradient reads it.
RankActivations rank_activations(const Config& cfg, const ModelSpec& rank_spec,
                                 const MeshShape& mesh, const std::vector<int64_t>& chunk_moe,
                                 const std::vector<int64_t>& chunk_moe_full,
                                 const std::vector<int64_t>& chunk_moe_act, bool count_ops,
                                 ActivationCache* cache) {
  const ParallelConfig& par = cfg.parallel;
  const int64_t moe_layers = std::accumulate(chunk_moe.begin(), chunk_moe.end(), int64_t{0});
  const int64_t moe_full =
      std::accumulate(chunk_moe_full.begin(), chunk_moe_full.end(), int64_t{0});
  std::string key;
  if (cache) {
    // What the rank's model depends on beyond the model config: its part of the model and the
    // shapes of its micro-batch and groups (and whether ep's gradients are a zero-bubble stash,
    // or under DualPipeV that and a whole backward's moment).
    std::string layers;
    for (const auto& [b, e] : rank_spec.chunks) layers += concat(b, "-", e, ",");
    key = concat(layers, rank_spec.tp_rank, "/", rank_spec.tp_size, " ep ", rank_spec.ep_rank, "/",
                 rank_spec.ep_size, " sp ", par.sequence_parallel, " cp ", mesh.size(Axis::cp),
                 static_cast<int>(par.cp_impl), par.cp_ulysses, " mbs ", cfg.train.micro_batch_size,
                 " rc ", static_cast<int>(cfg.train.recompute), cfg.train.recompute_layers, "/",
                 static_cast<int>(cfg.train.recompute_modules.bits), "/",
                 cfg.train.distribute_saved_activations, " ", static_cast<int>(cfg.train.precision),
                 " fp8 ", static_cast<int>(cfg.train.fp8), "/", cfg.train.fp8_block, " ",
                 static_cast<int>(grad_dtype(cfg.train)), " ", rank_spec.has_embedding,
                 rank_spec.has_head, count_ops, " zb ",
                 mesh.size(Axis::pp) > 1 && splits_backward(par.pp_schedule),
                 mesh.size(Axis::pp) > 1 && par.pp_schedule == PipeSchedule::dualpipe_v);
    if (const auto it = cache->by_layout.find(key); it != cache->by_layout.end()) return it->second;
  }
  const int tp = mesh.size(Axis::tp), cp = mesh.size(Axis::cp), ep = rank_spec.ep_size;
  // (reads_zero: the step run below reads its loss and the MoE layers' counts.)
  const std::unique_ptr<DeviceBackend> meta = make_meta_backend(/*reads_zero=*/true);
  Allocator alloc(*meta);
  const std::unique_ptr<Communicator> tp_group =
      make_shape_communicator(rank_spec.tp_rank, tp, "tp");
  const std::unique_ptr<Communicator> cp_group =
      cp > 1 ? make_shape_communicator(0, cp, "cp") : nullptr;
  const std::unique_ptr<Communicator> ep_group =
      ep > 1 ? make_shape_communicator(rank_spec.ep_rank, ep, "ep") : nullptr;
  const std::unique_ptr<Transformer> model =
      make_rank_model(cfg, rank_spec, alloc, tp_group.get(), cp_group.get(), ep_group.get());
  RankActivations out;
  const int chunks = model->num_chunks();
  for (int c = 0; c < chunks; ++c) {
    out.chunk_mb.push_back(static_cast<double>(model->chunk_activation_bytes(c)));
    out.chunk_stash.push_back(static_cast<double>(model->chunk_stash_bytes(c)));
  }
  out.scratch = static_cast<double>(model->scratch_bytes());
  if (ep > 1 && moe_layers > 0) {
    const int64_t N = cfg.train.micro_batch_size * cfg.model.seq_len / cp;
    const int64_t routed =
        (cfg.parallel.sequence_parallel && tp > 1 ? N / tp : N) * cfg.model.moe.top_k;
    const DType compute = compute_dtype(cfg.train.precision);
    out.ep_rows = static_cast<double>(spec_bytes(ep_rows_specs(rank_spec, routed, compute)));
    // (Its activation's buffer, a moment's in the forward and the weight backward, is smaller
    // than the input backward's buffers counted in ep_transient.)
    out.ep_rows_no_act =
        static_cast<double>(spec_bytes(ep_rows_specs(rank_spec, routed, compute, false)));
    for (size_t c = 0; c < out.chunk_mb.size(); ++c) {
      out.chunk_ep_rows.push_back(
          static_cast<double>(chunk_moe[c] - chunk_moe_full[c] - chunk_moe_act[c]) * out.ep_rows +
          static_cast<double>(chunk_moe_act[c]) * out.ep_rows_no_act);
      out.chunk_mb[c] += out.chunk_ep_rows.back();
    }
    // The backward's buffers, and under train.fp8 the quantised copies of the received rows
    // (allocated by the forward, the input and the weight backward for their GEMMs alike; counted
    // once, at the input backward's moment, where they join the backward's buffers).
    out.ep_transient = static_cast<double>(
        spec_bytes(ep_backward_specs(rank_spec, routed)) +
        spec_bytes(ep_fp8_specs(rank_spec, routed, {cfg.train.fp8, cfg.train.fp8_block})));
    // The gradients the weight half reads: one layer's for a moment under back-to-back
    // backwards, every MoE layer's from input half to weight half under a zero-bubble schedule.
    // A fully recomputed layer's rows likewise (from its replay or input half).
    // (DualPipeV runs both kinds of backward.)
    const double grads = static_cast<double>(spec_bytes(ep_grad_specs(rank_spec, routed)));
    if (mesh.size(Axis::pp) > 1 && splits_backward(cfg.parallel.pp_schedule)) {
      const bool whole_too = cfg.parallel.pp_schedule == PipeSchedule::dualpipe_v;
      for (size_t c = 0; c < out.chunk_stash.size(); ++c) {
        out.chunk_stash[c] += static_cast<double>(chunk_moe[c]) * grads +
                              static_cast<double>(chunk_moe_full[c]) * out.ep_rows;
        if (whole_too)
          out.chunk_whole.push_back((chunk_moe[c] > 0 ? grads : 0.0) +
                                    (chunk_moe_full[c] > 0 ? out.ep_rows : 0.0));
      }
    } else {
      out.ep_transient += grads;
      if (moe_full > 0) out.ep_full_rows = out.ep_rows;
    }
    out.scratch += out.ep_transient + out.ep_full_rows;
  }
  out.per_mb = std::accumulate(out.chunk_mb.begin(), out.chunk_mb.end(), 0.0) / chunks;
  if (count_ops)
    record_step(*model, alloc, Shape({cfg.train.micro_batch_size, cfg.model.seq_len / cp}),
                mesh.size(Axis::pp) > 1, out);
  if (cache) cache->by_layout.emplace(key, out);
  return out;
}

// ZeRO's buffers and traffic for one unit, in bytes, from its ZeroLayout (zero_layout.h, what Zero
// allocates): a gathered copy or gradient staging (its whole parameters), the all-gather staging
// (every rank's padded shards), a reduce-scatter's packed input plus output shard, and the bytes
// the communicators count for one all-gather of its shards, over dp x cp (and edp) and over the
// groups with tp (MoE's routed parameters).
// Stage 3 gathers the compute copy (16 bits in bf16/fp16: `whole`, `gather` and the
// `weights_pass` bytes at that width, `gather` then also holding the rounded shard sent); the
// fp32 `gather_pass` counts one pass over the shards for stages 1-2 and the reduce-scatters.
// Quantised (qwZ): `gather` is each part's packed int8 blocks (this rank's and every rank's),
// `weights_pass` their bytes, and finishing a gather holds `finish_extra` more at its peak (a
// part's dequantised staging beside the packed blocks not yet dequantised).
// Quantised gradients (qgZ: Zero::start_quantized, advance, finish_quantized): `reduce` is what
// the unit's reductions hold once started (each part's sum and its int4 blocks sent and
// received), `advance` what their second hop changes that by; the `*_extra` fields are the most
// they hold beyond that at once as they start, advance and finish (packed gradients, dequantised
// blocks); `qg1`, `qg2` the all-to-all bytes of each hop (over the groups with tp too).
struct ZeroUnitBytes {
  double whole = 0, whole_grads = 0, gather = 0, reduce = 0;
  double gather_pass = 0, gather_pass_tp = 0, weights_pass = 0, weights_pass_tp = 0;
  double finish_extra = 0;
  // hpZ: a gather of the secondary rows (staging; bytes counted, over the groups with tp too).
  double gather2 = 0, weights_pass2 = 0, weights_pass2_tp = 0;
  double reduce_extra = 0, advance = 0, advance_extra = 0, done_extra = 0;
  double qg1 = 0, qg1_tp = 0, qg2 = 0, qg2_tp = 0;
  double own_shard = 0;  // fp32 bytes of this rank's shards of the unit (read by each gather)
};

// The most a sequence of per-part steps holds beyond its start: part k changes what is held by
// delta[k] in the end, and at its own peak by extra[k] (>= 0), after the parts before it.
double phase_extra(const std::array<double, kZeroParts>& delta,
                   const std::array<double, kZeroParts>& extra) {
  double before = 0, most = 0;
  for (size_t k = 0; k < delta.size(); ++k) {
    most = std::max(most, before + extra[k]);
    before += delta[k];
  }
  return most;
}

// ZeroSequence (the order Zero's hooks run in) over one rank's step, its primitives counting what
// Zero allocates and frees and the all-gathers it starts: the peak of ZeRO's comm buffers and
// stage 3's all-gather bytes (under pp a unit may stay gathered from one micro-batch to the
// next, so the count depends on the schedule). units[0] is the root, units[l] layer l (1..L,
// global), empty (whole = 0) when this rank does not hold it.
class ZeroReplay final : public ZeroSequence {
 public:
  // `secondary`: hpZ, every gather of a unit after its first from the secondary rows.
  ZeroReplay(int stage, std::vector<ZeroUnitBytes> units, bool secondary = false)
      : ZeroSequence(stage, static_cast<int>(units.size()) - 1),
        units_(std::move(units)),
        gathered_(units_.size(), 0),
        gathering_(units_.size(), 0),
        staged_(units_.size(), 0),
        filled_(units_.size(), 0),
        secondary_(secondary) {}

  double peak() const { return peak_; }
  // The peak of ZeRO's buffers together with what hold() adds (the activations).
  double peak_with_held() const { return peak_all_; }
  void hold(double b) {
    held_ += b;
    peak_all_ = std::max(peak_all_, live_ + held_);
  }
  // Of every all-gather's bytes (gather_bytes), those of hpZ's secondary gathers.
  double gather_bytes() const { return gathers_; }
  double gather_bytes_tp() const { return gathers_tp_; }
  double secondary_gather_bytes() const { return gathers2_; }
  // The bytes of this rank's shards read by the step's gathers of them (hpZ's excluded).
  double shard_read_bytes() const { return shard_reads_; }

 private:
  const ZeroUnitBytes& at(int k) const { return units_[static_cast<size_t>(k)]; }
  void take(double b) {
    peak_ = std::max(peak_, live_ += b);
    peak_all_ = std::max(peak_all_, live_ + held_);
  }
  void give(double b) { live_ -= b; }
  bool holds(int k) const override { return at(k).whole > 0; }
  bool staged(int k) const override { return staged_[k] != 0; }
  // The bytes a gather in flight holds (gathering_: 1 the primary shards, 2 hpZ's secondary).
  double in_flight(int k) const { return gathering_[k] == 2 ? at(k).gather2 : at(k).gather; }
  void start_gather(int k) override {
    if (!holds(k) || gathered_[k] || gathering_[k]) return;
    if (filled_[k]) {
      take(at(k).gather2);
      gathers_ += at(k).weights_pass2;
      gathers2_ += at(k).weights_pass2;
      gathers_tp_ += at(k).weights_pass2_tp;
      gathering_[k] = 2;
      return;
    }
    take(at(k).gather);
    shard_reads_ += at(k).own_shard;
    gathers_ += at(k).weights_pass;
    gathers_tp_ += at(k).weights_pass_tp;
    gathering_[k] = 1;
  }
  void finish_gather(int k) override {
    if (!holds(k) || gathered_[k]) return;
    start_gather(k);
    take(at(k).whole);
    if (gathering_[k] == 1) {
      take(at(k).finish_extra);
      give(at(k).finish_extra);
      filled_[k] = secondary_;  // (the secondary rows are persistent: counted as params)
    }
    give(in_flight(k));
    gathering_[k] = 0;
    gathered_[k] = 1;
  }
  void release_gather(int k) override {
    if (gathering_[k]) give(in_flight(k));
    if (gathered_[k]) give(at(k).whole);
    gathering_[k] = gathered_[k] = 0;
  }
  void stage_gradients(int k) override {
    take(at(k).whole_grads);
    staged_[k] = 1;
  }
  void start_reduce(int k) override {
    if (!holds(k)) return;
    take(at(k).reduce_extra);
    give(at(k).reduce_extra);
    take(at(k).reduce);
    if (staged_[k]) give(at(k).whole_grads);  // the gradients now live in the packed input
    staged_[k] = 0;
    reducing_.push_back({k, false});
    complete_reductions(2);
  }
  // As Zero's: a unit's reductions are a run of entries; qgZ's second hop starts for every run
  // but the newest, and for the oldest before it completes.
  struct Reducing {
    int unit;
    bool advanced;
  };
  size_t units_in_flight() const {
    size_t n = 0;
    for (size_t i = 0; i < reducing_.size(); ++i)
      n += i == 0 || reducing_[i].unit != reducing_[i - 1].unit;
    return n;
  }
  void advance(Reducing& r) {
    if (r.advanced) return;
    r.advanced = true;
    take(at(r.unit).advance_extra);
    give(at(r.unit).advance_extra);
    take(at(r.unit).advance);
  }
  void complete_reductions(size_t keep) override {
    size_t older = reducing_.size();
    while (older > 0 && reducing_[older - 1].unit == reducing_.back().unit) --older;
    for (size_t i = 0; i < older; ++i) advance(reducing_[i]);
    while (units_in_flight() > keep) {
      const int k = reducing_.front().unit;
      for (size_t i = 0; i < reducing_.size() && reducing_[i].unit == k; ++i) advance(reducing_[i]);
      take(at(k).done_extra);
      give(at(k).done_extra);
      give(at(k).reduce + at(k).advance);
      reducing_.pop_front();
    }
  }

  std::vector<ZeroUnitBytes> units_;
  std::vector<char> gathered_, gathering_, staged_, filled_;
  bool secondary_;
  std::deque<Reducing> reducing_;
  double live_ = 0, peak_ = 0, gathers_ = 0, gathers_tp_ = 0, gathers2_ = 0, shard_reads_ = 0;
  double held_ = 0, peak_all_ = 0;
};

// Drives a ZeroReplay through one step of pipeline rank `pr` as the trainer and the pipeline
// executor call Zero's hooks (Transformer::forward/backward and their chunk forms): every
// micro-batch's forward and backward without pp, the schedule's actions with it (a zero-bubble
// schedule's hooks come with the weight half). `actions`: the rank's schedule (null without
// pp); `chunk_layers[c]`: chunk c's global layers.
void replay_step(ZeroReplay& z, const std::vector<Action>* actions, int micro_batches,
                 const std::vector<std::vector<int64_t>>& chunk_layers, bool embedding, bool head,
                 bool root_params, int64_t L, const MoeConfig& moe, const RankActivations& act,
                 int64_t full_layers, int64_t act_layers, int64_t mtp) {
  const int v = static_cast<int>(chunk_layers.size());
  // The activations: a micro-batch's saved set from before its forward's hooks (chunk_input)
  // to after its (weight) backward's (free_chunk), a zero-bubble stash from backward_input;
  // under ep each MoE layer's received rows from its forward to its (weight) backward, a fully
  // recomputed one's (the first full_layers of a chunk) from its backward's start (back to back:
  // act.ep_full_rows; zero-bubble: in the stash), a selectively recomputed one's routed
  // activation (the first act_layers, "moe_act") not among them. The multi-token prediction
  // modules' layers (L .. L + mtp - 1, with the head: block L + 1) recompute when every layer
  // does.
  const auto ep_rows = [&](int64_t l) { return act.ep_rows > 0 && moe.layer(l); };
  constexpr int64_t every = std::numeric_limits<int64_t>::max();
  const bool mtp_full = full_layers == every, mtp_act = act_layers == every;
  const auto kept = [&](bool recomputes_act) {
    return recomputes_act ? act.ep_rows_no_act : act.ep_rows;
  };
  const auto saved = [&](int c) {
    const size_t i = static_cast<size_t>(c);
    return act.chunk_mb[i] - (act.chunk_ep_rows.empty() ? 0.0 : act.chunk_ep_rows[i]);
  };
  const auto forward = [&](int c) {
    z.hold(saved(c));
    if (c == 0 && embedding) z.on_before_forward(0);
    const std::vector<int64_t>& ls = chunk_layers[static_cast<size_t>(c)];
    for (size_t k = 0; k < ls.size(); ++k) {
      z.on_before_forward(static_cast<int>(ls[k]) + 1);
      const int64_t i = static_cast<int64_t>(k);
      if (ep_rows(ls[k]) && i >= full_layers) z.hold(kept(i < act_layers));
    }
    if (c + 1 == v && head) {
      z.on_before_forward(static_cast<int>(L) + 1);
      for (int64_t l = L; l < L + mtp && !mtp_full; ++l)
        if (ep_rows(l)) z.hold(kept(mtp_act));
    }
  };
  const auto backward = [&](int c) {
    // (The rows go in the layer's weight backward, before its after-hook starts a reduction.)
    const auto rows = [&](int64_t l, bool full, bool recomputes_act) {
      if (!ep_rows(l)) return;
      const double at = act.ep_transient + (full ? act.ep_full_rows : 0.0);
      z.hold(at);
      z.hold(-at - (full ? act.ep_full_rows : kept(recomputes_act)));
    };
    const auto pair = [&](int64_t block, int64_t k) {
      z.on_before_backward(static_cast<int>(block));
      if (block >= 1 && block <= L) rows(block - 1, k < full_layers, k < act_layers);
      if (block == L + 1)
        for (int64_t l = L + mtp - 1; l >= L; --l) rows(l, mtp_full, mtp_act);
      z.on_after_backward(static_cast<int>(block));
    };
    if (c + 1 == v && head) pair(L + 1, 0);
    const std::vector<int64_t>& ls = chunk_layers[static_cast<size_t>(c)];
    for (int64_t k = static_cast<int64_t>(ls.size()) - 1; k >= 0; --k)
      pair(ls[static_cast<size_t>(k)] + 1, k);
    if (c == 0 && (embedding || root_params)) pair(0, 0);  // (Transformer::root_hooks)
    z.hold(-saved(c));
  };
  if (!actions) {
    for (int mb = 0; mb < micro_batches; ++mb) {
      z.on_start_micro_batch(mb + 1 == micro_batches);
      forward(0);
      backward(0);
    }
  } else {
    std::vector<int> last_mb(static_cast<size_t>(v), -1);
    for (const Action& a : *actions)
      if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight)
        last_mb[static_cast<size_t>(a.chunk)] = a.mb;
    for (const Action& a : *actions) {
      if (a.kind == ActionKind::forward) forward(a.chunk);
      const double stash = act.chunk_stash[static_cast<size_t>(a.chunk)];
      if (a.kind == ActionKind::backward_input) z.hold(stash);
      const double whole = a.kind == ActionKind::backward && !act.chunk_whole.empty()
                               ? act.chunk_whole[static_cast<size_t>(a.chunk)]
                               : 0.0;
      if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) {
        z.on_start_micro_batch(last_mb[static_cast<size_t>(a.chunk)] == a.mb);
        z.hold(whole);
        backward(a.chunk);
        z.hold(-whole);
        if (a.kind == ActionKind::backward_weight) z.hold(-stash);
      }
    }
  }
  z.on_finish_backward();
}

bool within_node(const HardwareProfile& hw, int span) {
  return hw.devices_per_node == 0 || span <= hw.devices_per_node;
}

// What predict_step derives once from the config and the profile, read by every pipeline rank's
// costs: the mesh, the micro-batches, the shapes of a rank's blocks, the schedule, FLOPs per
// token and each axis's bandwidth.
struct Job {
  Job(const Config& c, int world, const HardwareProfile& h, bool ops)
      : count_ops(ops),
        cfg(c),
        hw(h),
        par(c.parallel),
        spec(ModelSpec::from_config(c.model)),
        mc(spec.cfg),
        mesh(mesh_shape(par, world)),
        tp(mesh.size(Axis::tp)),
        cp(mesh.size(Axis::cp)),
        dp(mesh.size(Axis::dp)),
        p(mesh.size(Axis::pp)),
        v(static_cast<int>(par.virtual_stages)),
        ep(static_cast<int>(par.ep)),
        group(dp * cp),
        replicas(static_cast<int>(zero_replicas(par, dp))),
        zero_group(group / replicas),
        secondary_group(static_cast<int>(zero_secondary_group(par, cp))),
        qg_block(par.zero_stage == 3 && par.zero_quantized_gradients ? par.zero_quant_block : 0),
        qg_group(static_cast<int>(zero_qg_group(par, cp))),
        qg_hops2(qg_group > 0 && qg_group < zero_group ? zero_group / qg_group : 1),
        mbs(c.train.micro_batch_size),
        m(static_cast<int>(c.train.global_batch_size / (mbs * dp))),
        sp(par.sequence_parallel && tp > 1),
        sixteen(c.train.precision != Precision::fp32),
        distribute(c.train.distribute_saved_activations),
        grad_bytes(static_cast<double>(dtype_size(grad_dtype(c.train)))),
        rc(c.train.recompute),
        shape{p, v, m, p > 1 && v_shaped(c.parallel.pp_schedule),
              static_cast<int>(c.parallel.pp_max_deferred)},
        layout(model_layout(par, mesh)) {
    derive();
  }

  const bool count_ops;  // run each rank's model for its other ops' bytes (record_step)
  const Config& cfg;
  const HardwareProfile& hw;
  const ParallelConfig& par;
  const ModelSpec spec;
  const ModelConfig& mc;
  const MeshShape mesh;
  const int tp, cp, dp, p, v, ep;
  const int group;  // DDP and ZeRO reduce over dp x cp
  // Hybrid sharding (parallel.zero_shard_group): ZeRO's state in `replicas` copies, each sharded
  // over zero_group = group / replicas ranks (all of dp x cp: 1, group).
  const int replicas, zero_group;
  // hpZ: the secondary copy's group (zero_hierarchical_partition x cp ranks), 0 without it.
  const int secondary_group;
  // qgZ: the gradients' block (0: reduce-scattered), the first hop's group (zero_qg_group; 0:
  // one hop), and the second hop's ranks (1: one hop; where the first hop's groups cut the shard
  // group, their number in it).
  const int64_t qg_block;
  const int qg_group, qg_hops2;
  const int64_t mbs;
  const int m;  // micro-batches per step per dp rank
  const bool sp, sixteen;
  const bool distribute;    // train.distribute_saved_activations: 1/tp of replayed inputs
  const double grad_bytes;  // 4, or 2 with train.grad_dtype = "compute" in 16-bit
  const Recompute rc;
  const ScheduleShape shape;
  const ModelLayout layout;
  Dims d{};
  double T = 0, C = 0, tokens = 0;
  double peak = 0, eff_peak = 0;
  Schedule schedule;                  // every pp rank's actions (pp > 1)
  std::vector<int64_t> stage_layers;  // layers of each pipeline stage
  std::vector<double> layer_params;   // each layer's matmul weights (active), global
  // Of those, the weights whose GEMMs take FP8 inputs under train.fp8 (all but the router's);
  // empty without FP8.
  std::vector<double> layer_fp8_params;
  double head_fpt = 0, attn_fpt = 0;
  // Latent attention's up projections' forward FLOPs per token of a layer (q_b, kv_b), which
  // selective recompute's "mla_up_proj" replays.
  double mla_up_fpt = 0;
  // Multi-token prediction (model.mtp_depth), on the head's rank: the modules' FLOPs per token
  // (eh_proj, the layers, their heads) and their GEMMs with FP8 inputs; one module's layer's
  // FLOPs per token, and of those with FP8 inputs (what a full recompute's replay runs a third of).
  double mtp_fpt = 0, mtp_fp8_fpt = 0, mtp_layer_fpt = 0, mtp_layer_fp8_fpt = 0;
  std::array<double, kNumAxes> bw{};  // each axis's group's bandwidth
  double bw_dp = 0;                   // dp x cp's
  double bw_zero = 0;                 // ZeRO's shard group's (dp x cp's without hybrid sharding)
  double bw_secondary = 0;            // hpZ's secondary group's
  double bw_qg = 0;                   // qgZ's first hop's group's
  double bw_ep = 0;                   // an ep group's: ep consecutive ranks of dp x cp
  double per_rank_tokens = 0;         // positions of a step on one rank
  double E = 0;                       // one (N, C) f32 activation, bytes
  double f_tp = 0, f_dp = 0;

  // One layer's FLOPs per token: 6 x matmul weights + 6CT of attention, the forward a third;
  // a replay of selective recompute's core repeats the attention core's forward (2CT; the norms
  // and the activation it may rerun are no matmuls: other ops), a rebuild of latent attention's
  // qkv its up projections' forward (mla_up_fpt), full recompute's the layer's forward
  // (replayed_layers counts them).
  double layer_fpt(int64_t l) const { return 6 * layer_params[static_cast<size_t>(l)] + attn_fpt; }
  bool core_replays() const {
    return rc == Recompute::selective && cfg.train.recompute_modules.core_attn();
  }
  bool up_replays() const {
    return rc == Recompute::selective && cfg.train.recompute_modules.mla_up_proj();
  }
  // One layer's FLOPs per token, and of those with FP8 inputs (global layers; a multi-token
  // prediction module's layer past the model's).
  double any_layer_fpt(int64_t l) const { return l < mc.n_layers ? layer_fpt(l) : mtp_layer_fpt; }
  double any_layer_fp8_fpt(int64_t l) const {
    if (layer_fp8_params.empty()) return 0;
    return l < mc.n_layers ? 6 * layer_fp8_params[static_cast<size_t>(l)] : mtp_layer_fp8_fpt;
  }

 private:
  void derive();  // the figures after the mesh's
};

void Job::derive() {
  Job& j = *this;
  const ModelConfig& mc = j.mc;
  const ModelSpec& spec = j.spec;
  j.T = static_cast<double>(mc.seq_len);
  j.C = static_cast<double>(mc.d_model);
  j.tokens = static_cast<double>(j.cfg.train.global_batch_size) * j.T;
  j.peak = j.hw.peak(compute_dtype(j.cfg.train.precision));
  j.eff_peak = j.peak * j.hw.matmul_efficiency;
  Dims& d = j.d;
  d.B = static_cast<double>(j.mbs);
  d.T = j.T / j.cp;
  d.N = d.B * d.T;
  d.R = j.sp ? d.N / j.tp : d.N;
  d.C = j.C;
  d.H = static_cast<double>(mc.n_heads) / j.tp;
  d.KV = static_cast<double>(spec.n_kv_heads) / j.tp;
  d.D = static_cast<double>(spec.head_dim);
  d.F = static_cast<double>(spec.ffn_dim) / j.tp;
  d.F1 = static_cast<double>(spec.fc1_out) / j.tp;
  d.V = static_cast<double>(mc.vocab_size) / j.tp;
  if (mc.moe.enabled()) {
    d.E = static_cast<double>(mc.moe.num_experts);
    d.k = static_cast<double>(mc.moe.top_k);
    d.Fe = static_cast<double>(mc.moe.d_ff_expert);
    d.Fe1 = static_cast<double>(spec.expert_fc1_out);
    d.Fs = static_cast<double>(spec.shared_ffn) / j.tp;
    d.Fs1 = static_cast<double>(spec.shared_fc1_out) / j.tp;
    d.ep = static_cast<double>(j.ep);
    const int64_t R = static_cast<int64_t>(d.R), Tl = static_cast<int64_t>(d.T);
    d.Sr = static_cast<double>(R / std::gcd(R, Tl));
  }
  // Each layer's matmul weights (ModelSpec::matmul_weights: an MoE layer's experts k of E).
  j.layer_params.assign(static_cast<size_t>(mc.n_layers), 0.0);
  if (j.cfg.train.fp8 != Fp8Scaling::none)
    j.layer_fp8_params.assign(static_cast<size_t>(mc.n_layers), 0.0);
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& ps = spec.params[i];
    if (ps.layer < 0) continue;
    j.layer_params[static_cast<size_t>(ps.layer)] += spec.matmul_weights(i);
    if (!j.layer_fp8_params.empty() && ps.kind != ParamKind::router)
      j.layer_fp8_params[static_cast<size_t>(ps.layer)] += spec.matmul_weights(i);
  }
  j.head_fpt = 6 * static_cast<double>(mc.vocab_size) * j.C;
  // The attention core, forward and backward (ModelSpec::attention_width: C, or latent
  // attention's H (Dqk + Dv) / 2).
  j.attn_fpt = 6 * spec.attention_width() * j.T;
  // (A cp core that expands every block from the payloads, Ulysses or hybrid over the latent,
  // leaves kv_b out of qkv's build: LatentAttention::build_qkv.)
  const bool own_kv = cp_payload(j.cp, cp_kv_payload(j.cfg)) == 0 ||
                      ulysses_degree(j.par.cp_impl, j.cp, static_cast<int>(j.par.cp_ulysses)) == 1;
  for (size_t i = 0; i < spec.params.size(); ++i)
    if (spec.params[i].layer == 0 &&
        (spec.params[i].name.ends_with(".attn.q_b.weight") ||
         (own_kv && spec.params[i].name.ends_with(".attn.kv_b.weight"))))
      j.mla_up_fpt += 2 * spec.matmul_weights(i);
  if (mc.mtp_depth > 0) {
    // Each module: eh_proj (2C x C), its layer, its head; its layer recomputed when
    // train.recompute covers every layer (Transformer).
    const double D = static_cast<double>(mc.mtp_depth), eh = 2 * j.C * j.C;
    double w = 0, fp8 = 0;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      if (!spec.params[i].mtp) continue;
      w += spec.matmul_weights(i);
      if (spec.params[i].kind != ParamKind::router) fp8 += spec.matmul_weights(i);
    }
    j.mtp_fpt = 6 * w + D * (j.attn_fpt + j.head_fpt);
    j.mtp_layer_fpt = 6 * (w / D - eh) + j.attn_fpt;
    if (j.cfg.train.fp8 != Fp8Scaling::none) {
      j.mtp_fp8_fpt = 6 * (fp8 - D * eh);
      j.mtp_layer_fp8_fpt = 6 * (fp8 / D - eh);
    }
  }
  if (j.p > 1) j.schedule = make_schedule(j.par.pp_schedule, j.shape);
  j.stage_layers = j.par.pp_layers.empty()
                       ? std::vector<int64_t>(j.p * j.v, mc.n_layers / (j.p * j.v))
                       : j.par.pp_layers;
  // Bandwidth of each axis's group (rank 0's: every group of an axis spans as many ranks).
  int stride = 1;
  for (int a = 0; a < kNumAxes; ++a) {
    const int span = stride * j.mesh.degree[a];
    j.bw[a] = within_node(j.hw, span) ? j.hw.intra_node_bandwidth : j.hw.inter_node_bandwidth;
    stride = span;
  }
  j.bw_dp =
      within_node(j.hw, j.tp * j.cp * j.dp) ? j.hw.intra_node_bandwidth : j.hw.inter_node_bandwidth;
  // A shard group is zero_group consecutive ranks of dp x cp: world ranks spanning tp x them.
  j.bw_zero = within_node(j.hw, j.tp * j.zero_group) ? j.hw.intra_node_bandwidth
                                                     : j.hw.inter_node_bandwidth;
  j.bw_secondary = within_node(j.hw, j.tp * std::max(1, j.secondary_group))
                       ? j.hw.intra_node_bandwidth
                       : j.hw.inter_node_bandwidth;
  j.bw_qg = within_node(j.hw, j.tp * std::max(1, j.qg_group)) ? j.hw.intra_node_bandwidth
                                                              : j.hw.inter_node_bandwidth;
  // The ep group's members are ep consecutive ranks of the dp x cp group (Mesh::expert_group):
  // world ranks tp apart, so it spans tp x ep ranks.
  j.bw_ep = within_node(j.hw, j.tp * j.ep) ? j.hw.intra_node_bandwidth : j.hw.inter_node_bandwidth;
  j.per_rank_tokens = j.tokens / (j.dp * j.cp);
  j.E = 4 * d.N * j.C;
  j.f_tp = (j.tp - 1.0) / j.tp;
  j.f_dp = (j.group - 1.0) / j.group;
}

// One pipeline rank's layers (its chunks' global layers, the first recompute_layers of each
// chunk under recompute), counted by what the axes' costs read.
struct RankLayers {
  double L = 0, e = 0, h = 0;  // layers; whether the rank holds the embedding, the head
  double mtp = 0;  // multi-token prediction modules (with the head): a layer, an embedding lookup
                   // and a head each, and two norms
  // FLOPs per token of its layers, and of what recompute replays of them (replayed_layers).
  double fpt = 0, recompute_fpt = 0;
  double fp8_fpt = 0;        // of those, the GEMMs with FP8 inputs (train.fp8), replays included
  double cp_expand_fpt = 0;  // the latent cp core's kv_b GEMMs on other ranks' payloads
  bool moe = false;
  double moe_layers = 0;  // MoE layers, and those a full recompute replays in backward
  double moe_replays = 0;
  double moe_full = 0;  // MoE layers recomputed fully (their ep rows dispatched again)
  // Per chunk: its MoE layers (the head's chunk with the multi-token prediction modules'), and
  // of them the fully recomputed ones (their sums are moe_layers and moe_full) and those whose
  // routed experts' activation selective recompute reruns ("moe_act").
  std::vector<int64_t> chunk_moe, chunk_moe_full, chunk_moe_act;
  // Layers replayed per micro-batch under full recompute (replayed_layers): each runs its
  // forward's tp collectives again (two all-reduces, or two all-gathers and two reduce-scatters
  // under SP); under distributed saved inputs each gathers its input, as does each forward of a
  // chunk that receives its input (input_gathers).
  double full_replays = 0, input_gathers = 0;
  // Layers whose attention core selective recompute replays in backward, per micro-batch
  // (replayed_layers): each replay runs the core's forward communication (cp) again, as full
  // recompute's replays do.
  double core_replays = 0;
  std::vector<std::vector<int64_t>> chunk_layers;  // global layers of each chunk
  int boundaries = 0, boundaries_back = 0;         // chunk ends that send forward; that send back
};

// What recompute replays in backward, over this rank's actions in order (no pp: each
// micro-batch's forward, then its backward). The model keeps one slot per kind of replay, which
// holds the last (layer, micro-batch) a forward or a replay ran: full recompute's replay set
// (Layer::full_set, scratch.replay_of); under selective recompute the core's scratch
// (scratch.core_of: the attention core's output) and latent attention's up projections'
// (scratch.mla.qkv_of: the core's input qkv). A layer's backward input half rebuilds its qkv and
// replays its core unless the slots hold them; its weight half (a split backward's) replays the
// core unless the slot holds it, rebuilding the qkv first unless that slot holds it; under full
// recompute each half replays the layer unless the set holds it. Without pp the last layer's
// forward leaves every slot to its backward. Under distributed saved inputs (full recompute only)
// the forward forgets the set wherever it writes the residual stream whole for a consumer that
// saves or sends a part (Transformer::forward_layers), and counts the inputs it gathers.
// Per micro-batch.
struct Replays {
  double layers = 0, moe = 0;  // layers replayed (full) or cores replayed (selective); MoE ones
  double input_gathers = 0;
  double fpt = 0, fp8_fpt = 0;  // FLOPs per token of all of them, and of those with FP8 inputs
};
Replays replayed_layers(const Job& j, int pr, const RankLayers& r) {
  const int64_t k_re = j.cfg.train.recompute_layers;
  const bool full = j.rc == Recompute::full, core = j.core_replays(), up = j.up_replays();
  const bool distributed = full && j.distribute, fp8 = j.cfg.train.fp8 != Fp8Scaling::none;
  auto re = [&](int64_t k) { return k_re == 0 || k < k_re; };
  using Slot = std::pair<int64_t, int>;  // (global layer, micro-batch)
  Slot last{-1, -1}, qkv{-1, -1};        // the replay set or the core's scratch; the qkv's
  Replays n;
  // The multi-token prediction modules' layers, after the head chunk's (recomputed when
  // train.recompute covers every layer).
  std::vector<int64_t> mtp;
  if (k_re == 0)
    for (int64_t k = 0; k < static_cast<int64_t>(r.mtp); ++k) mtp.push_back(j.mc.n_layers + k);
  const auto is_head = [&](int c) { return stage_of(j.shape, pr, c) == j.p * j.v - 1; };
  auto forward = [&](int c, int mb) {
    const std::vector<int64_t>& ls = r.chunk_layers[static_cast<size_t>(c)];
    const int64_t size = static_cast<int64_t>(ls.size());
    const bool head = is_head(c), embedding = stage_of(j.shape, pr, c) == 0;
    auto part = [&](int64_t k) { return distributed && (k < size ? re(k) : !head); };
    if (part(0)) last = {-1, -1};
    if (part(0) && !embedding) ++n.input_gathers;
    for (int64_t k = 0; k < size; ++k) {
      if (part(k + 1)) last = {-1, -1};
      if (re(k)) last = qkv = {ls[static_cast<size_t>(k)], mb};
    }
    if (head)
      for (const int64_t l : mtp) last = qkv = {l, mb};
  };
  auto rebuild = [&](Slot mine) {
    if (qkv != mine) {
      n.fpt += j.mla_up_fpt;
      n.fp8_fpt += fp8 ? j.mla_up_fpt : 0.0;
    }
    qkv = mine;
  };
  auto replay = [&](Slot mine) {
    if (last != mine) {
      ++n.layers;
      n.moe += j.mc.moe.layer(mine.first);
      if (full) {
        n.fpt += j.any_layer_fpt(mine.first) / 3;
        n.fp8_fpt += j.any_layer_fp8_fpt(mine.first) / 3;
      } else {
        n.fpt += j.attn_fpt / 3;
        if (up) rebuild(mine);
      }
    }
    last = mine;
  };
  auto backward = [&](int c, int mb, bool weight_half) {
    auto layer = [&](int64_t l) {
      if (up && !weight_half) rebuild({l, mb});
      if (full || core) replay({l, mb});
    };
    const std::vector<int64_t>& ls = r.chunk_layers[static_cast<size_t>(c)];
    if (is_head(c))
      for (auto l = mtp.rbegin(); l != mtp.rend(); ++l) layer(*l);
    for (int64_t k = static_cast<int64_t>(ls.size()) - 1; k >= 0; --k)
      if (re(k)) layer(ls[static_cast<size_t>(k)]);
  };
  if (j.p == 1) {
    for (int mb = 0; mb < j.m; ++mb) {
      forward(0, mb);
      backward(0, mb, false);
    }
  } else {
    for (const Action& a : j.schedule.ranks[static_cast<size_t>(pr)]) {
      if (a.kind == ActionKind::forward) forward(a.chunk, a.mb);
      if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input)
        backward(a.chunk, a.mb, false);
      if (a.kind == ActionKind::backward_weight) backward(a.chunk, a.mb, true);
    }
  }
  for (double* x : {&n.layers, &n.moe, &n.input_gathers, &n.fpt, &n.fp8_fpt}) *x /= j.m;
  return n;
}

RankLayers rank_layers(const Job& j, int pr, const ModelSpec& rs) {
  RankLayers r;
  r.e = rs.has_embedding ? 1 : 0;
  r.h = rs.has_head ? 1 : 0;
  r.chunk_layers.resize(static_cast<size_t>(j.v));
  r.chunk_moe.assign(static_cast<size_t>(j.v), 0);
  r.chunk_moe_full.assign(static_cast<size_t>(j.v), 0);
  r.chunk_moe_act.assign(static_cast<size_t>(j.v), 0);
  const bool moe_act = j.rc == Recompute::selective && j.cfg.train.recompute_modules.moe_act();
  int64_t layers = 0;
  for (int c = 0; c < j.v; ++c) {
    const int st = stage_of(j.shape, pr, c);
    if (j.p > 1) {  // (the turn of a V is a hand-off within the rank)
      const bool out = st < j.p * j.v - 1 && rank_of(j.shape, st + 1) != pr;
      const bool back = st > 0 && rank_of(j.shape, st - 1) != pr;
      r.boundaries += out + back;
      r.boundaries_back += back;
    }
    const int64_t first =
        std::accumulate(j.stage_layers.begin(), j.stage_layers.begin() + st, int64_t{0});
    const int64_t n = j.stage_layers[static_cast<size_t>(st)];
    layers += n;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t l = first + k;
      r.chunk_layers[static_cast<size_t>(c)].push_back(l);
      const bool is_moe = j.mc.moe.layer(l);
      const bool re = j.rc != Recompute::none &&
                      (j.cfg.train.recompute_layers == 0 || k < j.cfg.train.recompute_layers);
      r.moe = r.moe || is_moe;
      r.moe_layers += is_moe;
      r.moe_full += is_moe && re && j.rc == Recompute::full;
      r.chunk_moe[static_cast<size_t>(c)] += is_moe;
      r.chunk_moe_full[static_cast<size_t>(c)] += is_moe && re && j.rc == Recompute::full;
      r.chunk_moe_act[static_cast<size_t>(c)] += is_moe && re && moe_act;
      r.fpt += j.layer_fpt(l);
      r.fp8_fpt += j.any_layer_fp8_fpt(l);
    }
  }
  r.L = static_cast<double>(layers);
  // (Before replayed_layers, which walks the modules' layers too.)
  for (const int64_t l : rs.mtp_layers()) {
    const bool is_moe = j.mc.moe.layer(l);
    r.mtp += 1;
    r.moe = r.moe || is_moe;
    const bool full = is_moe && j.rc == Recompute::full && j.cfg.train.recompute_layers == 0;
    r.moe_layers += is_moe;
    r.moe_full += full;
    r.chunk_moe.back() += is_moe;  // (the head's chunk is the rank's last)
    r.chunk_moe_full.back() += full;
    r.chunk_moe_act.back() += is_moe && moe_act && j.cfg.train.recompute_layers == 0;
  }
  if (r.mtp > 0) {
    r.fpt += j.mtp_fpt;
    r.fp8_fpt += j.mtp_fp8_fpt;
  }
  if (j.rc != Recompute::none) {
    const Replays n = replayed_layers(j, pr, r);
    r.recompute_fpt = n.fpt;
    r.fp8_fpt += n.fp8_fpt;
    if (j.rc == Recompute::full) {
      r.full_replays = n.layers;
      r.moe_replays = n.moe;
      r.input_gathers = n.input_gathers;
    } else {
      r.core_replays = n.layers;
    }
  }
  // The latent cp core (cp_kv_payload), in kv_b GEMMs of 2 Ckv H (Dn+Dv) FLOPs a token for the
  // model's H heads (/tp with the rest), beyond the layer's own. Ring: every forward of a layer's
  // core (the selective recompute's and full recompute's replays included) expands the cp-1
  // blocks it receives, and its backward expands them again and contracts their gradients (input
  // and weight). Ulysses: every core forward, and the backward again, expands the rank's H/u heads
  // at u times its positions, one GEMM a token; the contractions replace the layer's own kv_b
  // backward. Hybrid: every core forward expands the rank's heads of all r blocks (r GEMMs a
  // token), and the backward replays that, expands the blocks again and contracts them (2r in
  // place of the layer's 2). Under both the layer's forward and full recompute's replays build
  // qkv without kv_b's GEMM (one a token less each; the up projections' rebuilds leave it out of
  // mla_up_fpt).
  const int u = ulysses_degree(j.par.cp_impl, j.cp, static_cast<int>(j.par.cp_ulysses));
  if (cp_payload(j.cp, cp_kv_payload(j.cfg)) > 0) {
    const MlaConfig& a = j.mc.mla;
    const double gemm = 2.0 * static_cast<double>(a.kv_lora_rank * j.mc.n_heads *
                                                  (a.qk_nope_head_dim + a.v_head_dim));
    const double cores = r.L + r.mtp + r.core_replays + r.full_replays, layers = r.L + r.mtp;
    const double rr = static_cast<double>(j.cp) / u;
    r.cp_expand_fpt = u == 1    ? (j.cp - 1.0) * gemm * (cores + 3.0 * layers)
                      : rr == 1 ? gemm * (layers + r.core_replays)
                                : gemm * (rr * cores + (4.0 * rr - 3.0) * layers - r.full_replays);
    if (j.cfg.train.fp8 != Fp8Scaling::none) r.fp8_fpt += r.cp_expand_fpt;  // (kv_b's GEMMs)
  }
  return r;
}

// MoE layers whose sequences lie on several ranks (cp chunks, tp rows) sum per-sequence counts
// over them in each forward and full-recompute replay: (mbs, E) i32 of expert loads, and with
// capacity (mbs, E, k, chunks) i32 that rank the assignments (MoeMlp::rank_base: chunks of L
// positions, L dividing the rank's segments and the cp chunks). Elements per layer.
double moe_count_elements(const Job& j) {
  const Dims& d = j.d;
  double n = static_cast<double>(j.mbs) * d.E;
  if (j.mc.moe.capacity_factor > 0 && (j.cp > 1 || j.sp)) {
    const int64_t Tg = j.mc.seq_len, Tcp = Tg / j.cp, R = static_cast<int64_t>(d.R);
    const int64_t Lrun = std::gcd(std::gcd(R, Tcp), j.cp > 1 ? Tg / (2 * j.cp) : Tg);
    n += static_cast<double>(j.mbs) * d.E * d.k * static_cast<double>(Tg / Lrun);
  }
  return n;
}

// tp: per micro-batch, the Megatron collectives of each layer (2 forward, 2 backward; with sp
// all-gathers before and reduce-scatters after the parallel linears, 6 AG + 4 RS), one more each
// for the embedding's output and the head's input gradient, the cross-entropy's 3 floats per
// position; a full-recompute replay runs the layer's forward up to the MLP's saved tensors: the
// attention's output collective (and with sp the MLP's all-gather); MoE layers their
// per-sequence counts. Under sp four of a layer's all-gathers move its norms' outputs (the
// attention's and the MLP's inputs, in forward and again for the weight gradients), stored in
// the compute type (16 bits in bf16/fp16, TpLayers::gathered); the other two move output
// gradients, fp32.
AxisBytes tp_bytes(const Job& j, const RankLayers& r) {
  AxisBytes t;
  if (j.tp == 1) return t;
  // Each multi-token prediction module counts as a layer, an embedding, a head and two norms
  // (its eh_proj projects this rank's rows: no collective).
  const double m = j.m, f = j.f_tp, E = j.E, L = r.L + r.mtp, e = r.e + r.mtp, h = r.h + r.mtp;
  if (!j.sp) {
    t.all_reduce = m * 2 * f * (E * (4 * L + 2 * r.full_replays + e + h) + h * 4 * 3 * j.d.N);
    // Distributed saved inputs: each replay gathers its layer's input, and each chunk that
    // receives its input (1/tp of it) gathers it before its forward; in the compute type.
    if (j.distribute)
      t.all_gather = m * f * E * (j.sixteen ? 0.5 : 1.0) * (r.full_replays + r.input_gathers);
    return t;
  }
  // An MoE layer without shared experts routes its own rows: its MLP has no collective
  // (forward: a gather and a reduce-scatter; backward: two gathers and a reduce-scatter).
  const double bare = j.mc.moe.shared_experts == 0 ? r.moe_layers : 0,
               bare_replays = j.mc.moe.shared_experts == 0 ? r.moe_replays : 0;
  // The attention's input side, in units of C per token: multi-head attention gathers its input
  // (1) in forward and again for qkv's weight gradient (1) and reduce-scatters its input gradient
  // (1). Latent attention (LatentAttention) gathers its normalised latents and k_pe (Cq + Ckv +
  // Dr; with a full-rank query x as well, C) and reduce-scatters their gradients; it keeps the
  // gathered latents, so only a full-rank query's input is gathered again.
  double in_fwd = 1, in_again = 1;
  if (j.mc.mla_attention()) {
    const MlaConfig& a = j.mc.mla;
    in_fwd = (static_cast<double>((a.q_lora_rank > 0 ? a.q_lora_rank : j.mc.d_model) +
                                  a.kv_lora_rank + a.qk_rope_head_dim)) /
             j.C;
    in_again = a.q_lora_rank > 0 ? 0 : 1;
  }
  t.reduce_scatter =
      m * f * E * ((3 + in_fwd) * L - 2 * bare + 2 * r.full_replays - bare_replays + e + h);
  const double norm_out = (j.sixteen ? 2.0 : 4.0) / 4.0;  // bytes of a norm output per fp32 byte
  t.all_gather = m * f * E *
                 (norm_out * ((2 + in_fwd + in_again) * L - 2 * bare +
                              (1 + in_fwd) * r.full_replays - bare_replays) +
                  (2 * L - bare + e + h));
  t.all_reduce = m * 2 * f *
                 (h * 4 * 3 * j.d.N +
                  4 * (j.mc.norm == NormKind::layernorm ? 2 : 1) * j.C * (2 * L + h + 2 * r.mtp) +
                  (r.moe_layers + r.moe_replays) * 4 * moe_count_elements(j));
  return t;
}

// cp: the ring's K/V (and dK/dV) blocks and Ulysses' all-to-alls of every layer; MoE layers
// their per-sequence counts.
AxisBytes cp_bytes(const Job& j, const RankLayers& r) {
  AxisBytes k;
  if (j.cp == 1) return k;
  const CpBytes b = cp_bytes_per_layer(j.par.cp_impl, j.cp, static_cast<int>(j.par.cp_ulysses),
                                       j.mbs, j.mc.seq_len, j.mc.n_heads / j.tp,
                                       j.spec.n_kv_heads / j.tp, j.spec.head_dim,
                                       compute_dtype(j.cfg.train.precision), cp_kv_payload(j.cfg));
  // Each replay of a core's forward (selective recompute of the core, full recompute) moves its
  // forward's share again.
  const double layers = (r.L + r.mtp) * j.m, replays = (r.core_replays + r.full_replays) * j.m;
  k.send = b.send * layers + b.forward.send * replays;
  k.recv = b.recv * layers + b.forward.recv * replays;
  k.all_to_all = b.all_to_all * layers + b.forward.all_to_all * replays;
  k.all_gather = b.all_gather * layers + b.forward.all_gather * replays;
  k.reduce_scatter = b.reduce_scatter * layers;
  k.all_reduce =
      j.m * (r.moe_layers + r.moe_replays) * 2 * (j.cp - 1.0) / j.cp * 4 * moe_count_elements(j);
  return k;
}

// pp: each chunk's output activation forward, (R, C) in the compute type (16 bits in
// bf16/fp16), and its input gradient backward, (R, C) f32, per micro-batch, for every chunk
// boundary this rank has; tied embeddings (or multi-token prediction) all-reduce the last
// stage's copy of wte's gradient between the first and the last stage (ZeRO reduces it after its
// reduce-scatter: this rank's rows only).
AxisBytes pp_bytes(const Job& j, const RankLayers& r) {
  AxisBytes q;
  if (j.p == 1) return q;
  // A chunk's output is sent as 1/tp of it under distributed saved inputs (PTD-P's scatter/gather).
  const double act = (j.sixteen ? 2 : 4) / (j.distribute ? j.tp : 1.0),
               fwd = r.boundaries - r.boundaries_back,
               back = r.boundaries_back;  // chunk ends sending forward; chunk starts sending back
  q.send = j.m * j.d.R * j.C * (act * fwd + 4 * back);
  q.recv = j.m * j.d.R * j.C * (act * back + 4 * fwd);
  // (None in a V, whose rank 0 holds both ends.)
  const bool ends_apart = rank_of(j.shape, 0) != rank_of(j.shape, j.p * j.v - 1);
  if (j.mc.embedding_on_last_stage() && ends_apart && (r.e > 0 || r.h > 0)) {
    const double rows = static_cast<double>(j.mc.vocab_size / j.tp);
    q.all_reduce =
        j.grad_bytes * j.C * (j.par.zero_stage >= 1 ? std::ceil(rows / j.zero_group) : rows);
  }
  return q;
}

// The data-parallel side of one rank's step: the bytes of dp x cp (and the ep/edp groups), the
// part that lands on tp, and what the optimizer and ZeRO's buffers come to.
struct DpCost {
  AxisBytes dp;          // over dp x cp (DDP's all-reduce, ZeRO's collectives, Muon's rows)
  AxisBytes on_tp;       // counted with tp: routed parameters when dp x cp is one rank; Muon's
  double zero_peak = 0;  // ZeRO's comm buffers at their peak
  // Hybrid sharding: the bytes of the all-reduce of every gradient shard across the replicas
  // (counted in dp.all_reduce too), once a step.
  double replica_all_reduce = 0;
  // hpZ: the all-gather bytes (counted in dp.all_gather too) within the secondary groups.
  double secondary_gather = 0;
  // qgZ: the all-to-all bytes of the first hop and of the second (counted in dp.all_to_all too).
  double qg_hop1 = 0, qg_hop2 = 0;
  double shard_reads = 0;  // stage 3: the bytes of this rank's shards its gathers read
  double zero_and_activations_peak = 0;   // with the activations live at each moment
  double whole = 0;                       // parameters the rank holds
  double adam_owned = 0, muon_owned = 0;  // elements each optimizer updates
  double muon_flops = 0;                  // Newton-Schulz
};

// dp x cp: DDP all-reduces the gradients once a step; ZeRO reduce-scatters the padded shards
// (stage 1 once, stages 2-3 every micro-batch) and all-gathers them (stages 1-2 after the
// update; stage 3 before each forward and backward, the root unit once). Under ep the expert
// stacks do all of it over the edp group (group / ep ranks) instead; MoE under tp reduces the
// routed parameters (router, expert stacks) over their groups times tp (ModelSpec::row_group),
// counted with dp (with tp when dp x cp is one rank: the group is then the tp axis's own).
DpCost dp_cost(const Job& j, int pr, const ModelSpec& rs, const RankLayers& r,
               const RankActivations& act) {
  DpCost out;
  const ParallelConfig& par = j.par;
  const int tp = j.tp, ep = j.ep, group = j.group;
  const bool muon = j.cfg.optimizer.type == OptimizerType::muon;
  const double edp = static_cast<double>(group / ep);
  double whole_experts = 0;
  // MoE under tp: the router and expert stacks, whose gradients DDP sums over tp x dp x cp.
  double whole_routed = 0;
  // One pass of ZeRO's collective over the padded shards: over dp x cp (and edp), and over the
  // groups with tp.
  double shards = 0, shards_tp = 0;
  // qgZ's all-to-all bytes of one pass of the reduction (first and second hop).
  double qg1 = 0, qg1_tp = 0, qg2 = 0, qg2_tp = 0;
  // Muon's row all-gathers (as shards).
  double muon_rows = 0, muon_rows_tp = 0;
  // ZeRO's units as Zero lays them out on rank 0 of the group (zero_layout.h): each unit's
  // buffers and all-gather bytes (ZeroReplay); units[0] the root, units[l + 1] layer l.
  const ZeroLayout layout = zero_layout(rs, j.mc.n_layers, j.zero_group, 0);
  // hpZ: the units cut over the secondary groups (Zero's secondary rows).
  const ZeroLayout secondary =
      j.secondary_group > 0 ? zero_layout(rs, j.mc.n_layers, j.secondary_group, 0) : ZeroLayout{};
  double own_shards = 0;  // this rank's padded gradient shards, elements
  std::vector<ZeroUnitBytes> zero_units(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    ZeroUnitBytes& zu = zero_units[u];
    const double cw = j.sixteen ? 0.5 : 1.0;  // the compute copy's bytes per fp32 byte
    zu.whole = 4 * cw * static_cast<double>(layout.units[u].full_numel);
    zu.whole_grads = j.grad_bytes * static_cast<double>(layout.units[u].full_numel);
    // qwZ: each part's packed blocks (Zero::start_gather), and the most finish_gather holds
    // at once beyond them: part k's staging beside the packed blocks of parts k, k+1, ...
    const int64_t qb = par.zero_quantized_weights ? par.zero_quant_block : 0;
    std::array<double, kZeroParts> packed{}, staging{};
    // qgZ: each part's step changes and peaks as its reductions start, advance and finish.
    std::array<double, kZeroParts> start_d{}, start_x{}, adv_d{}, adv_x{}, done_d{}, done_x{};
    for (int k = 0; k < kZeroParts; ++k) {
      const double all = 4 * static_cast<double>(layout.all_shards(u, k)),
                   own = 4 * static_cast<double>(layout.own_shard(u, k));
      own_shards += static_cast<double>(layout.own_shard(u, k));
      zu.own_shard += own;
      const bool tp = layout.over_tp[static_cast<size_t>(k)];
      const size_t kk = static_cast<size_t>(k);
      if (qb > 0 && layout.own_shard(u, k) > 0) {
        const double words =
                         static_cast<double>(ops::int_packed_words(layout.own_shard(u, k), qb, 8)),
                     n = layout.n[kk];
        packed[kk] = 4 * words * (n + 1);
        staging[kk] = cw * all;
        zu.gather += packed[kk];
        (tp ? zu.weights_pass_tp : zu.weights_pass) += 4 * words * (n - 1);
      } else {
        zu.gather += cw * all + (j.sixteen ? cw * own : 0);
        (tp ? zu.weights_pass_tp : zu.weights_pass) += cw * (all - own);
      }
      if (j.qg_block > 0 && layout.own_shard(u, k) > 0) {
        // Zero::start_quantized / advance / finish_quantized: the packed gradients (n shards)
        // and the sum (one), the int4 blocks of the n shards sent and received over the first
        // hop (n1 = n / C ranks), over the second (C ranks) the C sums' blocks; each hop's
        // received blocks dequantised (fp32) beside them.
        const double n = layout.n[kk], C = j.qg_hops2,
                     s = static_cast<double>(layout.own_shard(u, k));
        const double w =
            static_cast<double>(ops::int_packed_words(layout.own_shard(u, k), j.qg_block, 4));
        const double pk = n * s * j.grad_bytes, out = s * j.grad_bytes, s1 = 4 * n * w,
                     s2 = 4 * C * w, d1 = 4 * n * s;
        start_x[kk] = pk + out + s1;
        start_d[kk] = out + 2 * s1;
        const double sf = C > 1 ? s2 : s1, df = 4 * (C > 1 ? C : n) * s;
        if (C > 1) {
          adv_x[kk] = std::max({0.0, d1 - s1, d1 - 2 * s1 + s2});
          adv_d[kk] = 2 * s2 - 2 * s1;
        }
        done_x[kk] = std::max(0.0, df - sf);
        done_d[kk] = -(2 * sf + out);
        const double n1 = n / C;
        (tp ? zu.qg1_tp : zu.qg1) += (n1 - 1) / n1 * s1;
        (tp ? zu.qg2_tp : zu.qg2) += (C - 1) / C * s2;
        zu.reduce += start_d[kk];
        zu.advance += adv_d[kk];
      } else {
        zu.reduce += (all + own) * j.grad_bytes / 4;  // the packed gradients and this rank's sum
      }
      (tp ? zu.gather_pass_tp : zu.gather_pass) += all - own;
    }
    zu.reduce_extra = phase_extra(start_d, start_x);
    zu.advance_extra = phase_extra(adv_d, adv_x);
    zu.done_extra = phase_extra(done_d, done_x);
    for (int k = 0; k < kZeroParts && j.secondary_group > 0; ++k) {
      const double all2 = 4 * cw * static_cast<double>(secondary.all_shards(u, k)),
                   own2 = 4 * cw * static_cast<double>(secondary.own_shard(u, k));
      zu.gather2 += all2;
      (secondary.over_tp[static_cast<size_t>(k)] ? zu.weights_pass2_tp : zu.weights_pass2) +=
          all2 - own2;
    }
    for (int k = 0; k < kZeroParts; ++k) {
      double held = staging[static_cast<size_t>(k)];
      for (int m = k; m < kZeroParts; ++m) held += packed[static_cast<size_t>(m)];
      zu.finish_extra = std::max(zu.finish_extra, held - zu.gather);
    }
    shards += zu.gather_pass;
    shards_tp += zu.gather_pass_tp;
    qg1 += zu.qg1;
    qg1_tp += zu.qg1_tp;
    qg2 += zu.qg2;
    qg2_tp += zu.qg2_tp;
    for (const ZeroParam& p : layout.units[u].params) {
      const size_t i = p.index;
      const double numel = static_cast<double>(rs.params[i].shape.numel());
      const bool expert = rs.grad_group(i).ep, over_tp = layout.over_tp[p.part];
      out.whole += numel;
      if (over_tp && !expert) whole_routed += numel;
      if (expert) whole_experts += numel;
      // What the optimizer updates on rank 0 of the group: all of it under DDP, its rows under
      // ZeRO. Muon all-gathers each hidden matrix's rows over the row group (ZeRO) once a step.
      const double own =
          par.zero_stage >= 1 ? static_cast<double>(p.own_rows_of(0) * p.row_numel) : numel;
      if (muon && rs.is_hidden_matrix(i)) {
        out.muon_owned += own;
        const double pass = static_cast<double>(p.shard_rows * p.row_numel *
                                                (layout.n[static_cast<size_t>(p.part)] - 1)) *
                            4;
        if (par.zero_stage >= 1) (over_tp ? muon_rows_tp : muon_rows) += pass;
      } else {
        out.adam_owned += own;
      }
    }
  }
  // Muon: each hidden matrix all-gathered over tp when tp shards it, and orthogonalised whole on
  // every rank: ns_steps x (X X^T, A A, B X) on the smaller Gram, 4 k^2 l + 2 k^3 FLOPs (k, l =
  // the smaller and larger dim).
  if (muon) {
    for (const MuonMatrix& mm : muon_layout(rs, tp).matrices) {
      const double rows_m = static_cast<double>(mm.whole[-2]),
                   cols_m = static_cast<double>(mm.whole[-1]);
      const double kk = std::min(rows_m, cols_m), ll = std::max(rows_m, cols_m);
      const double count = mm.whole.ndim() == 3 ? static_cast<double>(mm.whole[0]) : 1.0;
      out.muon_flops += count * static_cast<double>(j.cfg.optimizer.muon.ns_steps) *
                        (4 * kk * kk * ll + 2 * kk * kk * kk);
      if (!(mm.whole == rs.params[mm.param].shape))
        out.on_tp.all_gather += (tp - 1.0) / tp * 4 * static_cast<double>(mm.whole.numel());
    }
  }
  // Zero's hooks over this rank's step: stage 3's all-gathers and ZeRO's comm buffer peak, and
  // with the activations the step holds at each moment (without ZeRO: no unit, the activations
  // alone).
  ZeroReplay zero(static_cast<int>(par.zero_stage),
                  par.zero_stage >= 1 ? zero_units : std::vector<ZeroUnitBytes>(zero_units.size()),
                  j.secondary_group > 0);
  const int64_t full_layers = j.rc != Recompute::full ? 0
                              : j.cfg.train.recompute_layers == 0
                                  ? std::numeric_limits<int64_t>::max()
                                  : j.cfg.train.recompute_layers;
  const int64_t act_layers =
      j.rc != Recompute::selective || !j.cfg.train.recompute_modules.moe_act() ? 0
      : j.cfg.train.recompute_layers == 0 ? std::numeric_limits<int64_t>::max()
                                          : j.cfg.train.recompute_layers;
  replay_step(zero, j.p > 1 ? &j.schedule.ranks[static_cast<size_t>(pr)] : nullptr, j.m,
              r.chunk_layers, r.e > 0, r.h > 0, par.zero_stage >= 1 && zero_units[0].whole > 0,
              j.mc.n_layers, j.mc.moe, act, full_layers, act_layers, static_cast<int64_t>(r.mtp));
  out.zero_peak = zero.peak();
  out.zero_and_activations_peak = zero.peak_with_held();
  out.secondary_gather = zero.secondary_gather_bytes();
  out.shard_reads = zero.shard_read_bytes();
  AxisBytes& g = out.dp;
  AxisBytes& g_tp = group > 1 ? g : out.on_tp;
  const double m = j.m;
  // Stages 1-2 all-gather the updated weights in the compute type (Zero::gather_into); the
  // gradients are reduced in their own type (train.grad_dtype).
  const double weights = j.sixteen ? 0.5 : 1.0, grads = j.grad_bytes / 4.0;
  if (group > 1 || shards_tp > 0) {
    switch (par.zero_stage) {
      case 0: {
        // (Under tp the experts' replicas are at every tp coordinate too: edp x tp ranks.)
        const double n_e = edp * (r.moe && tp > 1 ? tp : 1), n_r = static_cast<double>(tp) * group;
        g.all_reduce = 2 * j.f_dp * j.grad_bytes * (out.whole - whole_experts - whole_routed) +
                       2 * (n_e - 1) / n_e * j.grad_bytes * whole_experts;
        g_tp.all_reduce += 2 * (n_r - 1) / n_r * j.grad_bytes * whole_routed;
        break;
      }
      case 1:
        g.reduce_scatter = grads * shards;
        g.all_gather = weights * shards;
        g_tp.reduce_scatter += grads * shards_tp;
        g_tp.all_gather += weights * shards_tp;
        break;
      case 2:
        g.reduce_scatter = m * grads * shards;
        g.all_gather = weights * shards;
        g_tp.reduce_scatter += m * grads * shards_tp;
        g_tp.all_gather += weights * shards_tp;
        break;
      default:
        if (j.qg_block > 0) {  // qgZ: the int4 all-to-alls instead of the reduce-scatters
          out.qg_hop1 = m * qg1;
          out.qg_hop2 = m * qg2;
          g.all_to_all += out.qg_hop1 + out.qg_hop2;
          g_tp.all_to_all += m * (qg1_tp + qg2_tp);
        } else {
          g.reduce_scatter = m * grads * shards;
          g_tp.reduce_scatter += m * grads * shards_tp;
        }
        g.all_gather = zero.gather_bytes();
        g_tp.all_gather += zero.gather_bytes_tp();
    }
    g.all_gather += muon_rows;
    g_tp.all_gather += muon_rows_tp;
  }
  // Hybrid sharding: each shard's step gradient all-reduced over the replicas (Zero's
  // complete_reductions; every part, whatever its group, under dp).
  if (par.zero_stage >= 1 && j.replicas > 1) {
    out.replica_all_reduce = 2 * (j.replicas - 1.0) / j.replicas * j.grad_bytes * own_shards;
    g.all_reduce += out.replica_all_reduce;
  }
  return out;
}

// Expert parallelism (counted with dp: the ep group is made of dp ranks): per MoE layer and
// micro-batch, the count exchange and 4 crossings of the rows routed to other ranks' experts and
// of those received, at balanced routing (each a fraction (ep-1)/ep of the N k): the rows and the
// experts' outputs in the compute type (16 bits in bf16/fp16), their gradients in fp32; a fully
// recomputed layer's backward dispatches its rows again (the count exchange and one crossing),
// and its replay brings the experts' outputs back once more (one crossing; MoeMlp::ep_forward).
// All-to-all bytes.
double ep_all_to_all_bytes(const Job& j, const RankLayers& r) {
  if (j.ep == 1) return 0;
  const double ep = j.ep, act = j.sixteen ? 2 : 4;
  const double rows = j.d.R * j.d.k * (ep - 1.0) / ep * j.C;  // of the rank's R rows, elements
  const double counts = (ep - 1.0) * (j.d.E / ep) * 4;
  return j.m * r.moe_layers * (2 * act * rows + 2 * 4 * rows + counts) +
         j.m * r.moe_full * (act * rows + counts) + j.m * r.moe_replays * act * rows;
}

// Memory: the exact state, the in-flight activations and the buffers.
void rank_memory(const Job& j, int pr, const ModelSpec& rs, const RankLayers& r, const DpCost& dc,
                 const RankActivations& act, StageCost& s) {
  s.memory = rank_state_bytes(
      rs, j.par.zero_stage, j.zero_group, 0, j.sixteen, j.cfg.optimizer.type,
      static_cast<int>(dtype_size(grad_dtype(j.cfg.train))), j.secondary_group,
      j.cfg.offload.optimizer == OffloadTarget::nvme, j.cfg.offload.params == OffloadTarget::nvme);
  // [offload] "nvme": the update reads and writes every offloaded byte once; ZeRO-3's offloaded
  // shards are read by every gather from them too.
  s.offload_io_bytes = 2 * s.memory.offloaded;
  if (j.cfg.offload.params == OffloadTarget::nvme && j.par.zero_stage == 3)
    s.offload_io_bytes += dc.shard_reads;
  s.in_flight = j.p > 1 ? formula_peak_in_flight(j.par.pp_schedule, j.shape, pr) : 1;
  // Activations: one micro-batch's saved set times those in flight (a zero-bubble schedule's
  // stashes, between their two backward halves, on top), and the model's scratch.
  double held = s.in_flight * act.per_mb;
  if (j.p > 1 && splits_backward(j.par.pp_schedule))
    held = schedule_activation_peak(j.schedule.ranks[static_cast<size_t>(pr)], act.chunk_mb,
                                    act.chunk_stash, act.chunk_whole);
  s.memory.activations = held + act.scratch;
  // The ops besides the matmuls and attention, every micro-batch.
  s.other_ops_bytes = j.m * act.other_bytes_mb;
  s.rounding_bytes = j.m * act.rounding_bytes_mb;
  for (const auto& [op, bytes] : act.other_by_op) s.other_ops_by_op[op] = j.m * bytes;
  // Comm buffers: ZeRO's (the replay's peak over this rank's units: its gathered copies,
  // gradient staging and at most three units' reduce-scatters; Zero stages its collectives on a
  // group of one rank too), pipeline send/recv buffers, the cp ring's K/V blocks.
  double comm = dc.zero_peak;
  // ep: the per-expert row counts exchanged; pp: the executor's gradient buffers, each (R, C).
  if (j.ep > 1 && r.moe) comm += static_cast<double>(ep_count_bytes(j.spec));
  if (j.p > 1) comm += PipelineExecutor::peak_comm_bytes(4 * j.d.R * j.C, r.boundaries_back > 0);
  comm += static_cast<double>(
      cp_buffer_bytes(j.par.cp_impl, j.cp, static_cast<int>(j.par.cp_ulysses), j.mbs, j.mc.seq_len,
                      j.mc.n_heads / j.tp, j.spec.n_kv_heads / j.tp, j.spec.head_dim,
                      compute_dtype(j.cfg.train.precision), cp_kv_payload(j.cfg)));
  s.memory.comm = comm;
  // The concurrent peak: the activations and ZeRO's buffers as the step's replay holds them
  // together, beside what is held all step.
  s.peak = s.memory.params + s.memory.grads + s.memory.optimizer +
           (act.scratch - act.ep_transient - act.ep_full_rows) + (comm - dc.zero_peak) +
           dc.zero_and_activations_peak;
}

// Time. tp and pp transfers sit on the critical path; the ring's transfers hide behind the
// attention blocks as far as they last; Ulysses' all-to-alls (and latent Ulysses' gathers and
// reduce-scatters of the payload) do not hide. dp: DDP's buckets,
// ZeRO-1's reduce-scatters (each unit's started as the last micro-batch's backward completes it,
// ZeroSequence) and ZeRO-2/3's per-micro-batch collectives overlap the backward (two thirds of a
// micro-batch's compute and other ops) or, for ZeRO-3's gathers, the whole micro-batch; stages
// 1-2's all-gather of the updated weights (Zero::step, before the next forward) waits. (Each window
// times the profile's comm_overlap: 0 on CPUs, whose MPI transfers hide behind nothing.) The
// optimizer: AdamW reads the parameter, gradient and both moments and writes three (4 bytes each)
// of what the rank owns, and refreshes the 16-bit copy of what it holds; Muon's elementwise work
// moves about as much (momentum, update, rows, weights: 7 passes of 4 bytes), its Newton-Schulz
// GEMMs run at the matmul rate, and its all-gathers wait.
void stage_time(const Job& j, const RankLayers& r, const DpCost& dc, StageCost& s) {
  const auto bw = [&](Axis a) { return j.bw[static_cast<int>(a)]; };
  const AxisBytes &q = s.bytes[static_cast<int>(Axis::pp)],
                  &k = s.bytes[static_cast<int>(Axis::cp)],
                  &g = s.bytes[static_cast<int>(Axis::dp)];
  s.comm_s[static_cast<int>(Axis::tp)] = s.bytes[static_cast<int>(Axis::tp)].total() / bw(Axis::tp);
  s.comm_s[static_cast<int>(Axis::pp)] = (q.send + q.all_reduce) / bw(Axis::pp);
  const double attn_s =
      j.per_rank_tokens * r.L * j.attn_fpt / j.tp / j.eff_peak * j.hw.comm_overlap;
  s.comm_s[static_cast<int>(Axis::cp)] =
      std::max(0.0, k.send / bw(Axis::cp) - attn_s) +
      (k.all_to_all + k.all_gather + k.reduce_scatter + k.all_reduce) / bw(Axis::cp);
  s.other_ops_s = s.other_ops_bytes / j.hw.memory_bandwidth;
  const double m = j.m;
  const double mb_s = (s.compute_s + s.other_ops_s) / m * j.hw.comm_overlap, bwd_s = mb_s * 2 / 3;
  // ZeRO's collectives run over its shard group; under hybrid sharding each unit's shard is
  // all-reduced over the replicas (dp x cp's span) as the last micro-batch's reduce-scatter of it
  // completes: behind that backward with the reduce-scatters (stage 1: blocking, on the way).
  // hpZ's gathers of the secondary rows run within their group, at its span's bandwidth; so does
  // qgZ's first all-to-all within its groups where they cut the shard group (its second crosses
  // them).
  const double rs_s = g.reduce_scatter / j.bw_zero +
                      dc.qg_hop1 / (j.qg_hops2 > 1 ? j.bw_qg : j.bw_zero) + dc.qg_hop2 / j.bw_zero,
               ag_s = (g.all_gather - dc.secondary_gather) / j.bw_zero +
                      dc.secondary_gather / j.bw_secondary,
               ar_s = dc.replica_all_reduce / j.bw_dp;
  double dp_s = 0;
  switch (j.par.zero_stage) {
    case 0:
      dp_s = std::max(0.0, g.all_reduce / j.bw_dp - bwd_s);
      break;
    case 1:
      // Zero reduces each unit as the last micro-batch's backward finishes it, as DDP does.
      dp_s = std::max(0.0, rs_s + ar_s - bwd_s) + ag_s;
      break;
    case 2:
      dp_s =
          (m - 1) * std::max(0.0, rs_s / m - bwd_s) + std::max(0.0, rs_s / m + ar_s - bwd_s) + ag_s;
      break;
    default:
      dp_s = (m - 1) * std::max(0.0, (rs_s + ag_s) / m - mb_s) +
             std::max(0.0, (rs_s + ag_s) / m + ar_s - mb_s);
  }
  s.comm_s[static_cast<int>(Axis::dp)] = dp_s;
  // ep's dispatch and combine all-to-alls (their bytes counted with dp): MoeMlp waits for each
  // before it goes on (engine/model/blocks.cpp), so none of it hides behind compute, and it is
  // on every micro-batch's path through the pipeline.
  s.ep_s = (g.all_to_all - dc.qg_hop1 - dc.qg_hop2) / j.bw_ep;
  s.optimizer_s = (28 * (dc.adam_owned + dc.muon_owned) + (j.sixteen ? 4 * dc.whole : 0)) /
                      j.hw.memory_bandwidth +
                  dc.muon_flops / j.eff_peak;
}

// One pipeline rank's costs, axis by axis.
StageCost stage_cost(const Job& j, int pr, ActivationCache* cache) {
  StageCost s;
  s.pp_rank = pr;
  s.rank = j.mesh.rank_of({0, 0, 0, pr});
  const ModelSpec rs = parallelize(j.spec, j.layout, s.rank);
  s.embedding = rs.has_embedding;
  s.head = rs.has_head;
  const RankLayers r = rank_layers(j, pr, rs);
  s.layers = static_cast<int64_t>(r.L);
  // FLOPs and compute time.
  s.flops =
      j.per_rank_tokens * (r.fpt + r.recompute_fpt + r.cp_expand_fpt + r.h * j.head_fpt) / j.tp;
  s.recompute_flops = j.per_rank_tokens * (r.recompute_fpt + r.cp_expand_fpt) / j.tp;
  // train.fp8 is emulated (docs/model.md): those GEMMs multiply dequantised fp32 values, at the
  // profile's fp32 peak.
  const double fp8_flops = j.per_rank_tokens * r.fp8_fpt / j.tp;
  s.compute_s = (s.flops - fp8_flops) / j.eff_peak +
                fp8_flops / (j.hw.peak(DType::f32) * j.hw.matmul_efficiency);
  AxisBytes& t = s.bytes[static_cast<int>(Axis::tp)];
  t = tp_bytes(j, r);
  s.bytes[static_cast<int>(Axis::cp)] = cp_bytes(j, r);
  s.bytes[static_cast<int>(Axis::pp)] = pp_bytes(j, r);
  const RankActivations act = rank_activations(j.cfg, rs, j.mesh, r.chunk_moe, r.chunk_moe_full,
                                               r.chunk_moe_act, j.count_ops, cache);
  const DpCost dc = dp_cost(j, pr, rs, r, act);
  AxisBytes& g = s.bytes[static_cast<int>(Axis::dp)];
  g = dc.dp;
  t.all_reduce += dc.on_tp.all_reduce;
  t.reduce_scatter += dc.on_tp.reduce_scatter;
  t.all_gather += dc.on_tp.all_gather;
  g.all_to_all += ep_all_to_all_bytes(j, r);
  rank_memory(j, pr, rs, r, dc, act, s);
  stage_time(j, r, dc, s);
  return s;
}

}  // namespace

StepCost predict_step(const Config& cfg, int world, const HardwareProfile& hw,
                      ActivationCache* cache, bool count_ops) {
  validate_layout(cfg, world);
  const Job j(cfg, world, hw, count_ops);
  StepCost out;
  out.world = world;
  out.micro_batches = j.m;
  out.peak = j.peak;
  out.model_flops = j.spec.flops_per_token() * j.tokens;
  // (DualPipeV with capped deferrals has no closed formula: its simulated bubble.)
  out.bubble = j.p == 1                    ? 0.0
               : j.shape.max_deferred >= 0 ? simulate(j.schedule).bubble_fraction
                                           : formula_bubble_fraction(j.par.pp_schedule, j.shape);
  for (int pr = 0; pr < j.p; ++pr) out.stages.push_back(stage_cost(j, pr, cache));

  // The pipeline runs at its slowest stage's pace, idle for the bubble.
  double busy = 0;
  for (const StageCost& s : out.stages)
    busy = std::max(busy, s.compute_s + s.other_ops_s + s.comm_s[static_cast<int>(Axis::tp)] +
                              s.comm_s[static_cast<int>(Axis::cp)] +
                              s.comm_s[static_cast<int>(Axis::pp)] + s.ep_s);
  out.hardware_flops = out.model_flops;
  for (size_t i = 0; i < out.stages.size(); ++i) {
    StageCost& s = out.stages[i];
    s.pipeline_s = busy * (1 + out.bubble);
    s.offload_s = hw.nvme_bandwidth > 0 ? s.offload_io_bytes / hw.nvme_bandwidth : 0;
    s.step_s = s.pipeline_s + s.comm_s[static_cast<int>(Axis::dp)] + s.optimizer_s + s.offload_s;
    out.hardware_flops += s.recompute_flops * j.tp * j.cp * j.dp;
    if (s.step_s > out.stages[static_cast<size_t>(out.slowest)].step_s)
      out.slowest = static_cast<int>(i);
    if (s.peak > out.stages[static_cast<size_t>(out.most_memory)].peak)
      out.most_memory = static_cast<int>(i);
    if (s.peak > kUsableMemoryFraction * hw.memory_bytes) out.fits = false;
  }
  out.step_s = out.stages[static_cast<size_t>(out.slowest)].step_s;
  out.tokens_per_s = j.tokens / out.step_s;
  out.mfu = out.model_flops / (out.step_s * world * out.peak);
  out.hfu = out.hardware_flops / (out.step_s * world * out.peak);
  return out;
}

std::vector<MemoryEstimate> stage_memory(const Config& cfg, int world) {
  HardwareProfile any;  // the times are not read: any positive figures do
  any.peak_fp32 = any.peak_bf16 = any.peak_fp16 = 1;
  any.memory_bandwidth = any.intra_node_bandwidth = any.inter_node_bandwidth = 1;
  std::vector<MemoryEstimate> out;
  for (const StageCost& s : predict_step(cfg, world, any, nullptr, /*count_ops=*/false).stages)
    out.push_back(s.memory);
  return out;
}

}  // namespace llmt
