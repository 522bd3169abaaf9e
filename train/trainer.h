// The training loop of one rank (Trainer): build the model from the config, then per step: one
// optimizer Step (train/step.h: data -> micro-batch forward/backward -> unscale/overflow check ->
// clip -> optimizer), then evaluation, stop requests, checkpoints and metrics.
#pragma once

#include <memory>
#include <string>

#include "engine/parallel/mesh.h"
#include "train/config.h"

namespace llmt {

struct TrainOptions {
  std::string dump_dir;    // if set: initial weights and every step's tokens (docs/model.md)
  std::string dump_final;  // if set: the weights after the last step, same format (rank 0)
  bool quiet = false;      // no progress lines
  // > 0: stop after this step (saving a checkpoint there when [checkpoint] dir is set), as if
  // the job had been interrupted; the LR schedule still runs to train.steps.
  int64_t stop_after = 0;
  // Start over in directories that hold an earlier run: its checkpoints in checkpoint.dir are
  // deleted and its metrics truncated (train/run_guard.h). Without it such a start is refused.
  bool overwrite = false;
  // The validation loss reads the test split instead of the valid one (`llmtrain eval --split
  // test`).
  bool eval_test_split = false;
};

struct TrainResult {
  int64_t steps = 0;  // the last step trained
  double final_loss = 0;
  // Set when the run stopped early on request ("SIGTERM", "train.time_limit"): it saved a
  // checkpoint (when [checkpoint] dir is set) and wrote its metrics; the app exits 75.
  std::string stopped;
  // A stop honoured inside step `dropped_step` (> 0) after `dropped_after` of this rank's
  // `micro_batches`: the step was dropped and runs again on resume.
  int64_t dropped_step = 0, dropped_after = 0, micro_batches = 0;
  // Set when the run stopped on a failure every rank saw alike (a non-finite loss or gradient
  // norm, too many skipped steps, non-finite values at a save): the message; the app exits 1.
  // The checkpoints written before it are complete.
  std::string error;
  std::string last_checkpoint;  // the newest checkpoint this run completed, "" if none
};

// One rank's run on `mesh` (validate_layout must have passed for its world size); rank 0 prints
// and writes. The constructor builds everything before the first step — the model stage and its
// shards, the data-parallel strategy, the pipeline executor, the loader at the resumed position,
// the metrics file — and loads the checkpoint to resume from; run() trains from there. Its
// construction and every step run collectives: every rank of the mesh makes the same calls.
class Trainer {
 public:
  Trainer(const Config& cfg, const TrainOptions& opts, Mesh& mesh);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  // Steps from the resumed step + 1 to train.steps (or TrainOptions::stop_after).
  TrainResult run();
  // The validation loss of the model as it stands: the mean over train.eval_iters global batches
  // of the valid split (or the test split, TrainOptions::eval_test_split), what training prints
  // as `val` (needs train.eval_interval > 0, which builds that split). Collective.
  double evaluate();

 private:
  struct State;  // trainer.cpp: what the run holds, and the loop's parts
  std::unique_ptr<State> s_;
};

// Trainer(cfg, opts, mesh).run().
TrainResult train(const Config& cfg, const TrainOptions& opts, Mesh& mesh);
// Single rank (a local mesh of one).
TrainResult train(const Config& cfg, const TrainOptions& opts);

// Compute type of a precision setting: fp32 -> f32, bf16 -> bf16, fp16 -> f16.
DType compute_dtype(Precision p);
// The weight gradients' type: f32, or with train.grad_dtype = "compute" the compute type.
DType grad_dtype(const TrainConfig& t);

}  // namespace llmt
