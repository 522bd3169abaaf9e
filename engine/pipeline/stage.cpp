// The pipeline stage (stage.h): the executor plus the collectives over pp that a step adds.
#include "engine/pipeline/stage.h"

#include <cmath>
#include <utility>

namespace llmt {

PipelineStage::PipelineStage(Schedule schedule, Transformer& model, Communicator& pp,
                             Allocator& alloc, bool shared_embedding)
    : executor_(std::move(schedule), model, pp, alloc), model_(model), pp_(pp) {
  predicted_bubble_ = simulate(executor_.schedule()).bubble_fraction;
  // In a V one rank holds both ends (one wte): nothing to sum.
  const ScheduleShape& shape = executor_.schedule().shape;
  const int first = rank_of(shape, 0),
            last = rank_of(shape, shape.stages * shape.virtual_stages - 1);
  if (!shared_embedding || first == last) return;
  const bool ends = pp.rank() == first || pp.rank() == last;
  embedding_group_ = pp.split(ends ? 0 : 1, pp.rank(), "embedding");
  if (!ends) embedding_group_.reset();
}

void PipelineStage::sum_tied_embedding_grads(const std::function<Tensor(size_t)>& owned_grad) {
  if (!embedding_group_) return;
  Tensor g = owned_grad(model_.spec().index_of("wte.weight"));
  if (g.defined()) embedding_group_->all_reduce(g).wait();
}

void PipelineStage::combine_over_stages(double& grad_norm, bool& overflow) {
  double v[2] = {grad_norm * grad_norm, overflow ? 1.0 : 0.0};
  pp_.all_reduce(Tensor(v, {2}, DType::f64)).wait();
  grad_norm = std::sqrt(v[0]);
  overflow = v[1] > 0;
}

double PipelineStage::measured_bubble() {
  float idle = static_cast<float>((executor_.total_seconds() - executor_.busy_seconds()) /
                                  executor_.busy_seconds());
  pp_.all_reduce(Tensor(&idle, {1}, DType::f32)).wait();
  return idle / static_cast<float>(pp_.size());
}

std::vector<Communicator*> PipelineStage::own_communicators() const {
  if (!embedding_group_) return {};
  return {embedding_group_.get()};
}

}  // namespace llmt
