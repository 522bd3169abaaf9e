// Data parallelism: the strategy that turns each rank's gradients of its slice of the global batch
// into the update of the global model, over the group it reduces over (the mesh's dp axis, and cp
// once context parallelism splits sequences: parameters replicate over both). DataParallel is the
// interface the trainer drives; make_data_parallel picks DDP (zero_stage 0, this file) or ZeRO 1-3
// (zero.h). Each is a ModelHooks: it acts per block while backward (and, for ZeRO-3, forward)
// runs, so communication overlaps compute. The trainer pre-scales each micro-batch's loss
// gradient by 1/(accumulation steps * dp), so a sum over dp is the global-batch mean.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/optim/sharded_optimizer.h"
#include "engine/parallel/mesh.h"
#include "engine/parallel/parallel_config.h"

namespace llmt {

// Gradient synchronisation (the subclasses: DDP's bucketed all-reduce, ZeRO's reduce-scatter)
// around a ShardedOptimizer over what this rank owns, which lists the training state.
class DataParallel : public ModelHooks, public TrainingState, public MatrixGather {
 public:
  // Before the step's first micro-batch: gradients to zero.
  virtual void start_step() = 0;
  // Before each micro-batch's forward; `last`: the step's final micro-batch (DDP syncs only then).
  virtual void start_micro_batch(bool last) = 0;
  // After the final micro-batch's backward: every reduction of the step has completed.
  virtual void finish_backward() = 0;
  // The L2 norm of the global gradient (over all parameters, all shards) and whether any element
  // is inf/nan (fp16), both the same on every dp rank.
  virtual double grad_norm() = 0;
  virtual bool grads_nonfinite() = 0;
  // AdamW on what this rank owns with gradients multiplied by grad_scale, then whatever makes the
  // parameters whole again (ZeRO-1/2: all-gather).
  virtual void step(double lr, int64_t t, float grad_scale) = 0;
  // Every parameter at global shape into `out` (P) f32 on the host, spec order, on every rank.
  virtual void gather_params(std::vector<float>& out) = 0;
  // TrainingState: the master weights this rank holds (master_tensors), then the optimizer's
  // state of its slots. after_load refreshes what derives from the master weights (the 16-bit
  // compute copy).
  std::vector<std::string> state_names() const override;
  std::vector<StateTensor> state_tensors() override;
  // The gradient of parameter i (model spec index) that this rank updates, after
  // finish_backward: the whole tensor (DDP), this rank's rows of it (ZeRO), or undefined when it
  // owns none of it. Pipeline parallelism sums the tied copies of wte through it.
  Tensor owned_grad(size_t i) { return opt_->grad_of(i); }
  // Calls update(rows, row_begin) on the master weights of parameter i that this rank's
  // optimizer owns (the whole tensor, or its rows; not at all when it owns none), before step():
  // for a parameter with an update rule of its own (aux-loss-free balancing's bias, which no
  // gradient reaches), made whole again by step() as the optimizer's updates are.
  void update_owned(size_t i, const std::function<void(Tensor rows, int64_t row_begin)>& update);
  // Aux-loss-free balancing (DeepSeek-V3's rule, docs/model.md): each MoE layer's expert bias
  // b_e += rate * sign(mean load - load_e), `loads` [global layer * E + expert] counted over the
  // step's global batch (the same on every rank, so every replica and shard of a bias moves
  // alike). Before step().
  void balance_expert_biases(const std::vector<double>& loads, float rate);
  // Seconds blocked on communication handles since the last call (exposed communication).
  virtual double take_wait_seconds();
  // MatrixGather (Muon): the row group's rows of a hidden matrix (gather_rows), then its tp
  // shards (all-gathered over tp and, for Shard(1), interleaved into columns).
  void gather(size_t param, Tensor rows, Tensor whole) override;
  void take_rows(size_t param, Tensor whole, Tensor rows) override;

 protected:
  // group: the ranks holding replicas of the same parameters that see different data. Makes the
  // gradient groups (grad_groups_) the whole model's parameters use: a collective over the mesh.
  DataParallel(Mesh& mesh, Communicator& group, Transformer& model, Allocator& alloc);
  // The master weights this rank holds for checkpoints: whole (DDP, ZeRO-1/2, the same on every
  // rank of the group after the step) or its rows (ZeRO-3).
  virtual std::vector<StateTensor> master_tensors() = 0;
  // Builds opt_ over `slots` (for Muon with the model's hidden matrices, and the tp buffers of
  // gather()); the subclass's constructor calls it once.
  void make_optimizer(const OptimizerConfig& cfg, std::vector<OptimizerSlot> slots);
  // This rank's slot rows of parameter i (undefined: none) -> its tensor `local` (this rank's
  // tp shard), every rank of the row group taking part; and back.
  virtual void gather_rows(size_t i, Tensor rows, Tensor local) = 0;
  virtual void take_local_rows(size_t i, Tensor local, Tensor rows) = 0;
  Mesh& mesh_;
  Communicator& group_;
  Transformer& model_;
  Allocator& alloc_;
  // The groups the parameters' gradients reduce over (ModelSpec::grad_group), by
  // GradGroup::index(): [0] is `group`; nullptr where no parameter of the model has that group.
  std::array<Communicator*, kNumGradGroups> grad_groups_{};
  Communicator* ep_group_ = nullptr;     // ep > 1: the ranks sharing out the experts
  std::optional<ShardedOptimizer> opt_;  // set by make_optimizer

 private:
  Buffer tp_local_, tp_staging_;  // Muon under tp: a tp shard, and all tp ranks' (Shard(1))
};

// Muon's view of a rank's model (spec: this rank's): its hidden matrices in spec order (slot -1,
// `whole` with the tp shards gathered), and the elements of the tp buffers DataParallel::gather
// allocates: one tp shard (the largest tp-sharded matrix) and every tp rank's shard of a
// Shard(1) matrix (the largest).
struct MuonLayout {
  std::vector<MuonMatrix> matrices;
  int64_t tp_local = 0, tp_staging = 0;
};
MuonLayout muon_layout(const ModelSpec& spec, int tp);

// What the Transformer allocates itself under `zero_stage` (2: no gradients, 3: neither; 1-2 in
// 16-bit `compute`: no fp32 master weights, ZeRO holds their rows).
ModelStorage model_storage(int64_t zero_stage, DType compute, DType grads = DType::f32);

// `model` must have been built with model_storage(cfg.zero_stage, its compute dtype) and (stages
// 0-2) initialised.
// The strategy reduces over mesh.group({dp, cp}).
std::unique_ptr<DataParallel> make_data_parallel(const ParallelConfig& cfg,
                                                 const OptimizerConfig& opt, Mesh& mesh,
                                                 Transformer& model, Allocator& alloc,
                                                 uint64_t seed);

// DDP: the flat gradient buffer cut into buckets of about bucket_mb at parameter boundaries, in
// reverse spec order (the order backward completes them); a bucket's all-reduce starts as soon
// as after_backward has fired for every block it covers on the step's last micro-batch.
//
// A bucket holds parameters of one gradient group (ModelSpec::grad_group) and reduces over it:
// under expert parallelism the expert stacks' buckets reduce over the ranks holding the same
// experts; under tp the routed parameters' (router, expert stacks) over their group times tp (each
// tp rank routed its own tokens). With ep the gradient norm adds the ep group's experts, and
// gather_params gathers them.
class DistributedDataParallel final : public DataParallel {
 public:
  DistributedDataParallel(const ParallelConfig& cfg, const OptimizerConfig& opt, Mesh& mesh,
                          Communicator& group, Transformer& model, Allocator& alloc);
  void start_step() override;
  void start_micro_batch(bool last) override { last_micro_ = last; }
  void before_backward(int block) override;
  void after_backward(int block) override;
  void finish_backward() override;
  double grad_norm() override;
  bool grads_nonfinite() override;
  void step(double lr, int64_t t, float grad_scale) override;
  void gather_params(std::vector<float>& out) override;
  void after_load() override { model_.sync_compute_weights(); }
  void gather_rows(size_t i, Tensor rows, Tensor local) override;
  void take_local_rows(size_t i, Tensor local, Tensor rows) override;

  struct Bucket {
    int64_t begin = 0, end = 0;  // element range of the flat gradient buffer
    int ready_block = 0;         // complete once after_backward(ready_block) has fired
    int group = 0;               // its parameters' GradGroup::index()
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  std::vector<StateTensor> master_tensors() override { return opt_->master_tensors(); }
  bool syncs_ = false;  // some gradient group has more than one rank
  std::vector<Bucket> buckets_;
  std::vector<Handle> pending_;
  size_t next_bucket_ = 0;
  bool last_micro_ = true;
};

// Buckets of about `bucket_bytes` over the parameters of `model` (see DistributedDataParallel),
// a bucket's parameters all of one gradient group, `group_of(i)` (default: 0, the data-parallel
// group).
std::vector<DistributedDataParallel::Bucket> make_buckets(
    const Transformer& model, int64_t bucket_bytes,
    const std::function<int(size_t)>& group_of = {});

}  // namespace llmt
