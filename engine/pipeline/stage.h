// One pp rank's pipeline stage beyond its chunks of the model: the executor that runs the
// schedule, and what a step needs across stages — the tied embeddings' group, the gradient norm and
// overflow flag summed over the stages, the measured and the predicted bubble. The step calls these
// at fixed points; nothing else of the run knows about pp.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "engine/comm/communicator.h"
#include "engine/model/transformer.h"
#include "engine/pipeline/executor.h"
#include "engine/schedule/schedule.h"

namespace llmt {

class PipelineStage {
 public:
  // The executor of `schedule` for this rank (pp.rank()) on `model`, its stage of the model; with
  // `shared_embedding` (tied embeddings or multi-token prediction:
  // ModelConfig::embedding_on_last_stage), the embedding group: pp rank 0's wte and the last
  // rank's tied copy (a split of pp, collective over it, which every pp rank makes); none in a V,
  // whose rank 0 holds both ends.
  PipelineStage(Schedule schedule, Transformer& model, Communicator& pp, Allocator& alloc,
                bool shared_embedding);

  PipelineExecutor& executor() { return executor_; }

  // Tied embeddings, after the gradient sync: both copies of wte get the sum of their gradients
  // (Megatron's embedding group). `owned_grad(i)`: the gradient of the stage spec's parameter i
  // this rank updates, undefined when it owns none (DataParallel::owned_grad); the same rows on
  // both ends, whose dp coordinates are the same. Nothing on the other stages, or without a copy.
  void sum_tied_embedding_grads(const std::function<Tensor(size_t)>& owned_grad);

  // This stage's gradient norm and overflow flag -> the whole model's, the same on every pp rank
  // (each stage's norm covers its parameters: the squares are summed over pp).
  void combine_over_stages(double& grad_norm, bool& overflow);

  // The last step's bubble, idle / compute time of this rank's schedule averaged over the pp ranks
  // (collective over pp), and the schedule's simulated one (forward 1, backward 2).
  double measured_bubble();
  double predicted_bubble() const { return predicted_bubble_; }

  // The groups split off pp (the embedding group), for the step's traffic counters.
  std::vector<Communicator*> own_communicators() const;

 private:
  PipelineExecutor executor_;
  Transformer& model_;
  Communicator& pp_;
  double predicted_bubble_ = 0;
  std::unique_ptr<Communicator> embedding_group_;  // null off the end stages, or untied
};

}  // namespace llmt
