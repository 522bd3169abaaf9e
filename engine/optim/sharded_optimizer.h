// The optimizer as the data-parallel strategies use it: AdamW over whatever a rank owns (whole
// parameters under DDP, row shards under ZeRO), each slot knowing which parameter and rows it is,
// and the training state listed as named tensors for checkpoints. Checkpoints store whatever
// state the optimizer lists ("param" plus its state names); nothing about Adam is baked into
// them (docs/checkpoint-format.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "engine/optim/optimizer.h"

namespace llmt {

// The name of the fp32 master weights among the state names (stored under "model/").
constexpr const char* kMasterState = "param";

// Every state a run with optimizer config `cfg` keeps and checkpoints store: kMasterState, then
// the optimizer's state names (known before anything is allocated, to check a checkpoint early).
std::vector<std::string> training_state_names(const OptimizerConfig& cfg);

// One tensor of training state a rank holds: rows [row_begin, row_begin + local.size(0)) of this
// tp rank's tensor of parameter `param` (ModelSpec::params[param].shape), f32 on the model's
// device, written and read in place. `state`: kMasterState or a state name the optimizer lists.
struct StateTensor {
  std::string state;
  size_t param = 0;
  Tensor local;
  int64_t row_begin = 0;
};

// What a rank holds of the training state, listed for checkpoints (which move it to and from the
// files without knowing the optimizer or the strategy).
class TrainingState {
 public:
  virtual ~TrainingState() = default;
  // kMasterState, then the optimizer's state names: every state a checkpoint stores.
  virtual std::vector<std::string> state_names() const = 0;
  // Every state tensor this rank holds (whole tensors or its rows of them).
  virtual std::vector<StateTensor> state_tensors() = 0;
  // After a checkpoint wrote into state_tensors(): refresh what derives from them.
  virtual void after_load() = 0;
};

// One parameter, or the rows of it this rank owns, that the optimizer updates: rows
// [row_begin, row_begin + value.size(0)) of parameter `param`, its fp32 master weights `value`
// and gradient `grad` (same shape), and whether weight decay applies.
struct OptimizerSlot {
  size_t param = 0;
  int64_t row_begin = 0;
  Tensor value, grad;
  bool decay = false;
};

class ShardedOptimizer {
 public:
  ShardedOptimizer(const OptimizerConfig& cfg, Allocator& alloc, std::vector<OptimizerSlot> slots);
  // One AdamW update of every slot (see AdamW::step).
  void step(double lr, int64_t t, float grad_scale);
  // The optimizer's state names, in the order state_tensors() lists them ("exp_avg",
  // "exp_avg_sq").
  std::vector<std::string> state_names() const;
  // The optimizer's state of every slot (not the master weights: which rows of those a rank
  // holds is the strategy's business).
  std::vector<StateTensor> state_tensors() const;
  // The master-weight rows of every slot, as state tensors.
  std::vector<StateTensor> master_tensors() const;
  const std::vector<OptimizerSlot>& slots() const { return slots_; }
  // The slot's gradient of parameter i, or an undefined Tensor when this rank owns none of it.
  Tensor grad_of(size_t i) const;

 private:
  std::vector<OptimizerSlot> slots_;
  std::vector<Tensor> values_, grads_;
  AdamW adamw_;
};

}  // namespace llmt
