// The optimizer as the data-parallel strategies use it: AdamW or Muon over whatever a rank owns
// (whole parameters under DDP, row shards under ZeRO), each slot knowing which parameter and rows
// it is, and the training state listed as named tensors for checkpoints. Checkpoints store
// whatever state the optimizer lists ("param" plus its state names); nothing about Adam is baked
// into them (docs/checkpoint-format.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "engine/optim/muon.h"
#include "engine/optim/optimizer.h"

namespace llmt {

// The name of the fp32 master weights among the state names (stored under "model/").
constexpr const char* kMasterState = "param";

// Every state a run with optimizer config `cfg` keeps and checkpoints store: kMasterState, then
// the optimizer's state names (known before anything is allocated, to check a checkpoint early).
// AdamW: exp_avg, exp_avg_sq. Muon: those (its AdamW parameters) and momentum_buffer.
std::vector<std::string> training_state_names(const OptimizerConfig& cfg);

// Whether a parameter keeps state `state` in a run (or checkpoint) whose states are `states`:
// the master weights always; under Muon (momentum_buffer among the states) a hidden matrix
// (ModelSpec::is_hidden_matrix) keeps momentum_buffer only and every other parameter the rest.
bool keeps_state(const std::vector<std::string>& states, const std::string& state,
                 bool hidden_matrix);

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

class ShardedOptimizer {
 public:
  // optimizer.type muon: `matrices` are the hidden matrices (MuonMatrix; slot indices into
  // `slots`) and `gather` makes them whole; both unused with AdamW.
  ShardedOptimizer(const OptimizerConfig& cfg, Allocator& alloc, std::vector<OptimizerSlot> slots,
                   std::vector<MuonMatrix> matrices = {}, MatrixGather* gather = nullptr);
  // One update of every slot (see Optimizer::step).
  void step(double lr, int64_t t, float grad_scale);
  // The optimizer's state names (training_state_names without the master weights).
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
  std::vector<std::string> state_names_;
  std::unique_ptr<Optimizer> opt_;
};

}  // namespace llmt
