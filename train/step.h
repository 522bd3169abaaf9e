// One optimizer step of a rank (Step): the step's micro-batches from the loader, staged on the
// device, forward/backward over them (or the pipeline schedule), the gradient sync, the norm and
// overflow check (over the stages under pp), clipping, the loss scale, the aux-loss-free expert
// bias update and the optimizer update; and validation's forward-only loss. The run loop
// (trainer.cpp) decides when steps, evaluations and saves happen and what a failure ends.
//
// Dims: mbs micro-batch sequences, T seq_len, Tl = T/cp the positions of a sequence this rank
// holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "data/loader.h"
#include "engine/data_parallel/data_parallel.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/mesh.h"
#include "engine/pipeline/stage.h"
#include "train/config.h"
#include "train/fault.h"
#include "train/metrics.h"
#include "train/stop.h"

namespace llmt {

namespace ckpt {
struct RunState;  // checkpoints/store.h
}

// A micro-batch's windows (mbs, T+1) on the host -> the device inputs and targets (mbs, Tl) i32
// at this rank's positions of each sequence (context_parallel.h's zigzag chunks; all T without
// cp), into one of `slots` pairs: under pp one per micro-batch of the step (every pp rank of a dp
// group reads the same ones; the first and last stage use them), else one. With multi-token
// prediction (mtp_depth D > 0) the targets are (1 + 2D, mbs, Tl): after them each depth's inputs
// and labels from the same window (Transformer::forward_backward), so that a cp rank reads the
// tokens ahead of its positions whatever rank holds them.
class TokenStaging {
 public:
  TokenStaging(Allocator& alloc, DeviceBackend& backend, int64_t slots, int64_t mbs, int64_t T,
               std::vector<int32_t> positions, int64_t mtp_depth = 0);
  void stage(const MicroBatch& mb, int64_t slot);
  Tensor inputs(int64_t slot) const;   // (mbs, Tl)
  Tensor targets(int64_t slot) const;  // (mbs, Tl), or (1 + 2D, mbs, Tl)

 private:
  DeviceBackend& backend_;
  const int64_t mbs_, T_, D_;
  const std::vector<int32_t> positions_;  // (Tl)
  const int64_t Tl_;
  Buffer buf_;                 // (slots, 2 + 2D, mbs, Tl): inputs, targets, each depth's two
  std::vector<int32_t> host_;  // (2 + 2D, mbs, Tl)
};

// What a Step acts on: this rank's parts of the run, owned by the caller and alive while the Step
// is.
struct StepParts {
  Mesh& mesh;
  DeviceBackend& backend;
  Allocator& alloc;  // the token staging
  Transformer& model;
  DataParallel& data_parallel;
  PipelineStage* pipeline;  // null without pp
  DataLoader& loader;       // this dp rank's slices of the training steps' global batches
  const FaultInjector& fault;
  const StopConditions& stops;  // asked between micro-batches
};

class Step {
 public:
  // `first_step`: the run's first step, whose first micro-batch times the long-step warning;
  // `resumed`: the run state of the checkpoint the run resumes from (the update count and the loss
  // scale), null for a fresh start.
  Step(const Config& cfg, const StepParts& parts, int64_t first_step,
       const ckpt::RunState* resumed);
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  // A stop request honoured between the micro-batches of a step (StopConditions): the step is
  // dropped, its gradients discarded, and it runs again on resume.
  struct Dropped {
    std::string why;   // "SIGTERM", "train.time_limit"
    int64_t done = 0;  // micro-batches run before the stop
  };
  struct Outcome {
    std::optional<Dropped> dropped;  // set: no update, and `m` holds nothing of the step
    // The loss or the gradient norm is inf/nan, not from an fp16 overflow (the loss scaler's to
    // skip): the update was skipped.
    bool nonfinite = false;
  };
  // Runs step `step` (1-based) and fills m's loss, lr, loss_scale, grad_norm, skipped and, with
  // MoE, moe. Collective: every rank of the mesh runs the same step.
  Outcome run(int64_t step, StepMetrics& m);

  // The mean loss over the next `micro_batches` of `valid` (this rank's slices), forward only and
  // without dropout, averaged over the world. Collective.
  double evaluate(DataLoader& valid, int64_t micro_batches, int64_t step);

  // What the step keeps between steps, into the run state of a checkpoint: the update count and
  // the loss scale (restored from `resumed` at construction).
  void save_state(ckpt::RunState& rs) const;
  // This rank's micro-batches per step (gradient accumulation).
  int64_t micro_batches() const { return accum_; }

 private:
  double forward_backward(int64_t step, float dloss, std::optional<Dropped>& dropped);
  StepMetrics::Moe moe_metrics();
  void warn_long_step(int64_t step, double first_s) const;
  double world_mean(double v);

  const Config& cfg_;
  Mesh& mesh_;
  DeviceBackend& backend_;
  Transformer& model_;
  DataParallel& data_parallel_;
  PipelineStage* pipeline_;
  DataLoader& loader_;
  const FaultInjector& fault_;
  const StopConditions& stops_;
  const int64_t dp_, cp_, gbs_, mbs_, accum_;
  const int64_t first_step_;
  LossScaler scaler_;
  int64_t updates_ = 0;  // optimizer updates applied (steps minus skipped ones)
  TokenStaging tokens_;
  std::vector<PipelineMicroBatch> pipe_mbs_;  // under pp: the step's micro-batches, one per slot
  // The step's MoE assignments per expert over the global batch, [layer * E + expert], the same
  // on every rank (aux-loss-free balancing reads them).
  std::vector<double> moe_loads_;
};

}  // namespace llmt
