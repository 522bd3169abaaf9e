// One optimizer step (step.h). The order of the collectives is fixed (every rank makes the same
// calls): the micro-batch stop agreement, the schedule or the micro-batches with their gradient
// reductions, the MoE statistics, the tied embeddings, the loss, the norm over the stages.
#include "train/step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <utility>

#include "checkpoints/store.h"
#include "engine/parallel/context_parallel.h"

namespace llmt {

TokenStaging::TokenStaging(Allocator& alloc, DeviceBackend& backend, int64_t slots, int64_t mbs,
                           int64_t T, std::vector<int32_t> positions, int64_t mtp_depth)
    : backend_(backend),
      mbs_(mbs),
      T_(T),
      D_(mtp_depth),
      positions_(std::move(positions)),
      Tl_(static_cast<int64_t>(positions_.size())),
      buf_(alloc.allocate_tensor({slots, 2 + 2 * D_, mbs, Tl_}, DType::i32, MemCategory::other)),
      host_(static_cast<size_t>((2 + 2 * D_) * mbs * Tl_)) {}

void TokenStaging::stage(const MicroBatch& mb, int64_t slot) {
  // Plane j of (2 + 2D, mbs, Tl): the token j places after each position's (inputs 0, targets
  // 1), and for depth k its inputs (2k: k ahead, 0 past the window) and labels (2k + 1: k + 1
  // ahead, -1 past it).
  const int64_t plane = mbs_ * Tl_;
  for (int64_t b = 0; b < mbs_; ++b)
    for (int64_t t = 0; t < Tl_; ++t) {
      const int64_t g = positions_[static_cast<size_t>(t)], at = b * (T_ + 1) + g;
      int32_t* out = host_.data() + b * Tl_ + t;
      out[0] = mb.tokens[at];
      out[plane] = mb.tokens[at + 1];
      for (int64_t k = 1; k <= D_; ++k) {
        out[2 * k * plane] = g + k <= T_ ? mb.tokens[at + k] : 0;
        out[(2 * k + 1) * plane] = g + k + 1 <= T_ ? mb.tokens[at + k + 1] : -1;
      }
    }
  backend_.copy_from_host(inputs(slot).data, host_.data(), host_.size() * 4);
}

Tensor TokenStaging::inputs(int64_t slot) const {
  return buf_.tensor({mbs_, Tl_}, DType::i32,
                     static_cast<size_t>((2 + 2 * D_) * slot * mbs_ * Tl_) * 4);
}

Tensor TokenStaging::targets(int64_t slot) const {
  const size_t off = static_cast<size_t>(((2 + 2 * D_) * slot + 1) * mbs_ * Tl_) * 4;
  if (D_ == 0) return buf_.tensor({mbs_, Tl_}, DType::i32, off);
  return buf_.tensor({1 + 2 * D_, mbs_, Tl_}, DType::i32, off);
}

namespace {

// Stop requests inside a step (docs/slurm.md): a step of many micro-batches can take longer than
// a job's grace period. Before each micro-batch after the first, every rank contributes its
// signal flag and whether train.time_limit would pass within one more micro-batch and a save to
// a non-blocking all-reduce over the world, and reads the one it started a boundary earlier
// (complete by then, so no rank waits on another for it): all ranks agree at the same boundary,
// one to two micro-batches after the request. The step is then dropped, not finished: its
// gradients are discarded, the checkpoint is the previous step's, and the step runs again on
// resume. Under pp the schedule's micro-batches are not interrupted: stops act at the step end.
class MicroBatchStops {
 public:
  MicroBatchStops(const StopConditions& stops, Communicator& world)
      : stops_(stops), world_(world), last_(std::chrono::steady_clock::now()) {}
  ~MicroBatchStops() { pending_.wait(); }  // the last one started; every rank started it
  // Set when the ranks agreed to stop before micro-batch `micro`.
  std::optional<Step::Dropped> agreed(int64_t micro) {
    const auto now = std::chrono::steady_clock::now();
    const double micro_s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    int32_t* mine = flags_[micro % 2];
    mine[0] = stops_.signal();
    mine[1] = stops_.time_up(now, micro_s) ? 1 : 0;
    const int32_t* seen = mine;
    if (world_.size() > 1) {
      pending_.wait();
      seen = flags_[(micro + 1) % 2];  // what the previous boundary's all-reduce agreed on
      const bool stop = micro > 1 && (seen[0] || seen[1]);
      pending_ = stop ? Handle() : world_.all_reduce(Tensor(mine, {2}, DType::i32), ReduceOp::max);
      if (!stop) return std::nullopt;
    } else if (!mine[0] && !mine[1]) {
      return std::nullopt;
    }
    return Step::Dropped{seen[0] ? signal_name(seen[0]) : "train.time_limit", micro};
  }

 private:
  const StopConditions& stops_;
  Communicator& world_;
  std::chrono::steady_clock::time_point last_;
  int32_t flags_[2][2] = {};
  Handle pending_;
};

}  // namespace

Step::Step(const Config& cfg, const StepParts& parts, int64_t first_step,
           const ckpt::RunState* resumed)
    : cfg_(cfg),
      mesh_(parts.mesh),
      backend_(parts.backend),
      model_(parts.model),
      data_parallel_(parts.data_parallel),
      pipeline_(parts.pipeline),
      loader_(parts.loader),
      fault_(parts.fault),
      stops_(parts.stops),
      dp_(parts.mesh.size(Axis::dp)),
      cp_(parts.mesh.size(Axis::cp)),
      gbs_(cfg.train.global_batch_size),
      mbs_(cfg.train.micro_batch_size),
      accum_(grad_accum_steps(cfg) / dp_),
      first_step_(first_step),
      scaler_(cfg.optimizer, cfg.train.precision == Precision::fp16),
      tokens_(parts.alloc, parts.backend, parts.pipeline ? accum_ : 1, mbs_, cfg.model.seq_len,
              zigzag_shard(cfg.model.seq_len, parts.mesh.size(Axis::cp), parts.mesh.coord(Axis::cp))
                  .positions(),
              cfg.model.mtp_depth),
      pipe_mbs_(static_cast<size_t>(parts.pipeline ? accum_ : 1)) {
  if (resumed) {
    scaler_.restore({static_cast<float>(resumed->loss_scale), resumed->loss_scale_clean_steps});
    updates_ = resumed->updates;
  }
}

void Step::save_state(ckpt::RunState& rs) const {
  const LossScaler::State sc = scaler_.state();
  rs.updates = updates_;
  rs.loss_scale = sc.scale;
  rs.loss_scale_clean_steps = sc.clean_steps;
}

// Losses are averaged over the world: every rank of a dp group saw different samples, tp/cp
// ranks of one group the same.
double Step::world_mean(double v) {
  Communicator& world = mesh_.world();
  if (world.size() == 1) return v;
  float x = static_cast<float>(v);
  world.all_reduce(Tensor(&x, {1}, DType::f32)).wait();
  return static_cast<double>(x) / world.size();
}

// The step's forward and backward over this rank's micro-batches (or the pipeline schedule);
// returns the sum of the micro-batches' mean losses. A stop request between micro-batches ends it
// early with `dropped` set.
double Step::forward_backward(int64_t step, float dloss, std::optional<Dropped>& dropped) {
  const uint64_t seed = cfg_.train.seed;
  if (!pipeline_) {
    double loss_sum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    MicroBatchStops stops(stops_, mesh_.world());
    for (int64_t micro = 0; micro < accum_; ++micro) {
      if (micro == 1) fault_.at("micro", step);
      if (micro > 0) {
        dropped = stops.agreed(micro);
        if (dropped) return loss_sum;
      }
      // This dp rank's slice of the step's global batch (BatchLayout).
      const MicroBatch& mb = loader_.next();
      tokens_.stage(mb, 0);
      const StepContext ctx{seed, step, mb.first_sample};
      data_parallel_.start_micro_batch(micro + 1 == accum_);
      loss_sum += model_.forward_backward(tokens_.inputs(0), tokens_.targets(0), dloss, ctx);
      if (micro == 0 && step == first_step_)
        warn_long_step(
            step, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return loss_sum;
  }
  for (int64_t micro = 0; micro < accum_; ++micro) {
    const MicroBatch& mb = loader_.next();
    tokens_.stage(mb, micro);
    pipe_mbs_[static_cast<size_t>(micro)] = {tokens_.inputs(micro), tokens_.targets(micro),
                                             StepContext{seed, step, mb.first_sample}};
  }
  return static_cast<double>(accum_) * pipeline_->executor().run(pipe_mbs_, dloss, [&](bool last) {
    data_parallel_.start_micro_batch(last);
  });
}

// A step whose micro-batches would take more than an hour, or past train.time_limit, at the rate
// of the run's first micro-batch: said on rank 0 before the rest of it runs (a stop inside it
// drops the work done).
void Step::warn_long_step(int64_t step, double first_s) const {
  const double estimate = first_s * static_cast<double>(accum_);
  const double limit = cfg_.train.time_limit;
  if (mesh_.rank() != 0 || accum_ < 2 || (estimate <= 3600 && (limit <= 0 || estimate <= limit)))
    return;
  const double hours = estimate / 3600, days = hours / 24, years = days / 365;
  const std::string span = years >= 2  ? detail::concat(static_cast<int64_t>(years), " years")
                           : days >= 2 ? detail::concat(static_cast<int64_t>(days), " days")
                                       : detail::concat(static_cast<int64_t>(hours + 0.5), " h");
  const std::string over = limit > 0 && estimate > limit
                               ? detail::concat(", longer than train.time_limit=", limit, " s")
                               : "";
  std::fprintf(stderr,
               "warning: step %lld will take about %s (%.0f s): %lld micro-batches of %.3g s (the "
               "first, measured) per rank (train.global_batch_size=%lld / (dp=%lld x "
               "train.micro_batch_size=%lld))%s. Stop signals and train.time_limit act between "
               "micro-batches (the step is then dropped and runs again on resume); lower "
               "train.global_batch_size for shorter steps\n",
               static_cast<long long>(step), span.c_str(), estimate, static_cast<long long>(accum_),
               first_s, static_cast<long long>(gbs_), static_cast<long long>(dp_),
               static_cast<long long>(mbs_), over.c_str());
}

// The step's mixture-of-experts metrics from the model's MoeStats, over all ranks; keeps each
// layer's assignments per expert over the global batch in moe_loads_.
StepMetrics::Moe Step::moe_metrics() {
  const MoeStats& st = model_.moe_stats();
  // Every layer's, the multi-token prediction modules' after the model's.
  const int64_t L = cfg_.model.n_layers + cfg_.model.mtp_depth, E = cfg_.model.moe.num_experts;
  // [aux, z, dropped, assigned, then each layer's E counts]: summed over the world, each layer's
  // counts are the local ones of its pp stage's ranks (each routes its own tokens).
  std::vector<double> v(static_cast<size_t>(4 + L * E), 0.0);
  v[0] = st.aux / static_cast<double>(accum_);
  v[1] = st.z / static_cast<double>(accum_);
  v[2] = static_cast<double>(st.dropped);
  v[3] = static_cast<double>(st.assigned);
  for (int64_t l = 0; l < L; ++l)
    for (size_t e = 0; e < st.load[static_cast<size_t>(l)].size(); ++e)
      v[static_cast<size_t>(4 + l * E) + e] =
          static_cast<double>(st.load[static_cast<size_t>(l)][e]);
  Communicator& world = mesh_.world();
  if (world.size() > 1)
    world.all_reduce(Tensor(v.data(), {static_cast<int64_t>(v.size())}, DType::f64)).wait();
  moe_loads_.assign(v.begin() + 4, v.end());
  StepMetrics::Moe m;
  m.aux = v[0] / static_cast<double>(dp_);  // each dp rank's sum over the pp stages, averaged
  m.z = v[1] / static_cast<double>(dp_);
  m.dropped = v[3] > 0 ? v[2] / v[3] : 0.0;
  m.ep_rows = st.ep_rows;  // this rank's
  m.load_min = 1.0;
  for (int64_t l = 0; l < L; ++l) {
    const auto first = v.begin() + 4 + l * E;
    const double total = std::accumulate(first, first + E, 0.0);
    if (total == 0) continue;  // a dense layer
    m.load_max = std::max(m.load_max, *std::max_element(first, first + E) / total);
    m.load_min = std::min(m.load_min, *std::min_element(first, first + E) / total);
  }
  return m;
}

Step::Outcome Step::run(int64_t step, StepMetrics& m) {
  Outcome out;
  data_parallel_.start_step();
  const float scale = scaler_.scale();
  // Pre-scaled by 1/(dp*cp) as well: the sum over dp x cp of the gradients is the global-batch
  // mean (each cp rank's loss is the mean over its Tl of every sequence).
  const float dloss = scale / static_cast<float>(accum_ * dp_ * cp_);
  fault_.at("forward", step);
  const bool moe = cfg_.model.moe.enabled(), mtp = cfg_.model.mtp_depth > 0;
  if (moe) model_.moe_stats().reset();
  if (mtp) model_.mtp_loss_sum() = 0;
  const double loss_sum = forward_backward(step, dloss, out.dropped);
  if (out.dropped) return out;  // a stop request inside the step: no update
  if (moe) m.moe = moe_metrics();
  fault_.at("backward", step);
  data_parallel_.finish_backward();
  if (pipeline_)
    pipeline_->sum_tied_embedding_grads([&](size_t i) { return data_parallel_.owned_grad(i); });
  m.loss = world_mean(loss_sum / static_cast<double>(accum_));
  // The modules run on the ranks holding the head, one in pp: their mean over those.
  if (mtp)
    m.mtp_loss = world_mean(model_.mtp_loss_sum() / static_cast<double>(accum_)) *
                 static_cast<double>(mesh_.size(Axis::pp));
  m.lr = lr_at(cfg_.optimizer, step);
  m.loss_scale = scale;
  // The gradients hold scale * dL/dw: overflow shows as inf/nan whatever the scale, the norm is
  // divided by it, and unscaling and clipping are fused into AdamW's read of the gradient.
  bool overflow = cfg_.train.precision == Precision::fp16 && data_parallel_.grads_nonfinite();
  double grad_norm = data_parallel_.grad_norm();
  if (pipeline_) pipeline_->combine_over_stages(grad_norm, overflow);
  m.grad_norm = grad_norm / scale;
  // fp16 overflow is the loss scaler's to skip; any other inf/nan loss or norm skips the update
  // (the parameters stay those of the previous step; the run loop decides whether the run goes
  // on).
  out.nonfinite = !overflow && (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm));
  m.skipped = out.nonfinite || scaler_.update(overflow);
  if (!m.skipped) {
    fault_.at("optimizer", step);
    const double coef = clip_coefficient(cfg_.optimizer, m.grad_norm);
    if (moe && cfg_.model.moe.balance == MoeBalance::bias)
      data_parallel_.balance_expert_biases(moe_loads_, cfg_.model.moe.bias_update_rate);
    data_parallel_.step(m.lr, ++updates_, static_cast<float>(coef / scale));
  }
  backend_.synchronize();
  return out;
}

// Validation: the loss of each micro-batch (the same ones every time, each rank taking its slices
// as in training), staged in slot 0.
double Step::evaluate(DataLoader& valid, int64_t micro_batches, int64_t step) {
  const Tensor inputs = tokens_.inputs(0), targets = tokens_.targets(0);
  double sum = 0;
  for (int64_t i = 0; i < micro_batches; ++i) {
    const MicroBatch& mb = valid.next();
    tokens_.stage(mb, 0);
    const StepContext ctx{cfg_.train.seed, step, mb.first_sample, /*dropout=*/false};
    sum += pipeline_ ? pipeline_->executor().forward_loss({inputs, targets, ctx})
                     : model_.forward_loss(inputs, targets, ctx);
  }
  return world_mean(sum / static_cast<double>(micro_batches));
}

}  // namespace llmt
