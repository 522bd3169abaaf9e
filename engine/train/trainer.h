// The training loop of one rank: build the model from the config, then per step: data ->
// micro-batch forward/backward -> unscale/overflow check -> clip -> AdamW -> metrics.
#pragma once

#include <memory>
#include <string>

#include "engine/parallel/mesh.h"
#include "engine/train/config.h"

namespace llmt {

struct TrainOptions {
  std::string dump_dir;    // if set: initial weights and every step's tokens (docs/model.md)
  std::string dump_final;  // if set: the weights after the last step, same format (rank 0)
  bool quiet = false;      // no progress lines
  // > 0: stop after this step (saving a checkpoint there when [checkpoint] dir is set), as if
  // the job had been interrupted; the LR schedule still runs to train.steps.
  int64_t stop_after = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
};

// On `mesh` (validate_layout must have passed for its world size); rank 0 prints and writes.
TrainResult train(const Config& cfg, const TrainOptions& opts, Mesh& mesh);
// Single rank (a local mesh of one).
TrainResult train(const Config& cfg, const TrainOptions& opts);

// Compute type of a precision setting: fp32 -> f32, bf16 -> bf16, fp16 -> f16.
DType compute_dtype(Precision p);

}  // namespace llmt
