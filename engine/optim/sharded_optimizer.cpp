#include "engine/optim/sharded_optimizer.h"

namespace llmt {

namespace {
std::vector<Tensor> field(const std::vector<OptimizerSlot>& slots, Tensor OptimizerSlot::*f) {
  std::vector<Tensor> out;
  for (const OptimizerSlot& s : slots) out.push_back(s.*f);
  return out;
}
std::vector<bool> decay_flags(const std::vector<OptimizerSlot>& slots) {
  std::vector<bool> out;
  for (const OptimizerSlot& s : slots) out.push_back(s.decay);
  return out;
}
}  // namespace

std::vector<std::string> training_state_names(const OptimizerConfig& cfg) {
  (void)cfg;  // one optimizer today: AdamW
  std::vector<std::string> out{kMasterState};
  for (const char* n : AdamW::kStateNames) out.push_back(n);
  return out;
}

ShardedOptimizer::ShardedOptimizer(const OptimizerConfig& cfg, Allocator& alloc,
                                   std::vector<OptimizerSlot> slots)
    : slots_(std::move(slots)),
      values_(field(slots_, &OptimizerSlot::value)),
      grads_(field(slots_, &OptimizerSlot::grad)),
      adamw_(cfg, alloc, values_, decay_flags(slots_)) {
  for (const OptimizerSlot& s : slots_)
    LLMT_CHECK(s.value.shape == s.grad.shape, "optimizer slot of parameter ", s.param, ": value ",
               s.value.shape.str(), ", gradient ", s.grad.shape.str());
}

void ShardedOptimizer::step(double lr, int64_t t, float grad_scale) {
  adamw_.step(values_, grads_, lr, t, grad_scale);
}

std::vector<std::string> ShardedOptimizer::state_names() const {
  std::vector<std::string> out;
  for (const AdamW::NamedState& s : adamw_.state()) out.push_back(s.name);
  return out;
}

std::vector<StateTensor> ShardedOptimizer::state_tensors() const {
  std::vector<StateTensor> out;
  for (const AdamW::NamedState& s : adamw_.state())
    for (size_t k = 0; k < slots_.size(); ++k)
      out.push_back({s.name, slots_[k].param, s.tensors[k], slots_[k].row_begin});
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
