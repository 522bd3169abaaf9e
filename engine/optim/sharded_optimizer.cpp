#include "engine/optim/sharded_optimizer.h"

#include <algorithm>

namespace llmt {

std::vector<std::string> training_state_names(const OptimizerConfig& cfg) {
  std::vector<std::string> out{kMasterState};
  for (const char* n : AdamW::kStateNames) out.push_back(n);
  if (cfg.type == OptimizerType::muon) out.push_back(kMuonState);
  return out;
}

bool keeps_state(const std::vector<std::string>& states, const std::string& state,
                 bool hidden_matrix) {
  if (state == kMasterState) return true;
  const bool muon = std::find(states.begin(), states.end(), kMuonState) != states.end();
  if (muon && hidden_matrix) return state == kMuonState;
  return state != kMuonState;
}

ShardedOptimizer::ShardedOptimizer(const OptimizerConfig& cfg, Allocator& alloc,
                                   std::vector<OptimizerSlot> slots,
                                   std::vector<MuonMatrix> matrices, MatrixGather* gather)
    : slots_(std::move(slots)) {
  for (const OptimizerSlot& s : slots_)
    LLMT_CHECK(s.value.shape == s.grad.shape, "optimizer slot of parameter ", s.param, ": value ",
               s.value.shape.str(), ", gradient ", s.grad.shape.str());
  std::vector<std::string> names = training_state_names(cfg);
  state_names_.assign(names.begin() + 1, names.end());
  if (cfg.type == OptimizerType::muon) {
    LLMT_CHECK(gather, "Muon needs the strategy's MatrixGather");
    opt_ = std::make_unique<Muon>(cfg, alloc, slots_, std::move(matrices), *gather);
  } else {
    opt_ = std::make_unique<AdamW>(cfg, alloc, slots_);
  }
}

void ShardedOptimizer::step(double lr, int64_t t, float grad_scale) {
  opt_->step(lr, t, grad_scale);
}

std::vector<std::string> ShardedOptimizer::state_names() const {
  return state_names_;
}

std::vector<StateTensor> ShardedOptimizer::state_tensors() const {
  std::vector<StateTensor> out;
  for (SlotState& s : opt_->state())
    out.push_back({std::move(s.name), slots_[s.slot].param, s.tensor, slots_[s.slot].row_begin});
  return out;
}

std::vector<StateTensor> ShardedOptimizer::master_tensors() const {
  std::vector<StateTensor> out;
  for (const OptimizerSlot& s : slots_)
    out.push_back({kMasterState, s.param, s.value, s.row_begin});
  return out;
}

Tensor ShardedOptimizer::grad_of(size_t i) const {
  for (const OptimizerSlot& s : slots_)
    if (s.param == i) return s.grad;
  return Tensor();
}

}  // namespace llmt
