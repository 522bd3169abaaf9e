// DDP: bucketed all-reduce of the flat gradient buffer over the data-parallel group, started from
// after_backward on the step's last micro-batch and waited before the optimizer. The factory for
// every strategy.
#include "engine/data_parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/data_parallel/tp_params.h"
#include "engine/data_parallel/zero.h"
#include "kernels/ops.h"

namespace llmt {

DataParallel::DataParallel(Mesh& mesh, Communicator& group, Transformer& model, Allocator& alloc)
    : mesh_(mesh), group_(group), model_(model), alloc_(alloc) {
  const ModelSpec& spec = model.spec();
  // Decided on the whole model, so that every rank makes the same groups in the same order.
  const std::array<bool, kNumGradGroups> used = spec.grad_groups_of_model();
  grad_groups_[0] = &group;
  for (int k = 1; k < kNumGradGroups; ++k)
    if (used[static_cast<size_t>(k)])
      grad_groups_[static_cast<size_t>(k)] = &mesh.grad_group(GradGroup::of_index(k), spec.ep_size);
  if (spec.ep_size > 1) ep_group_ = &mesh.expert_group(spec.ep_size);
}

std::vector<std::string> DataParallel::state_names() const {
  std::vector<std::string> out{kMasterState};
  for (std::string& n : opt_->state_names()) out.push_back(std::move(n));
  return out;
}

std::vector<StateTensor> DataParallel::state_tensors() {
  std::vector<StateTensor> out = master_tensors();
  for (StateTensor& t : opt_->state_tensors()) out.push_back(std::move(t));
  return out;
}

namespace {
// The tp placement that Muon has to undo for parameter p: Shard(0) or Shard(1) of a matrix over
// tp > 1, else replicated (expert stacks and routers are replicated over tp).
const Placement* tp_shard(const ParamSpec& p, int tp) {
  const Placement& pl = p.on(Axis::tp);
  return tp > 1 && pl.sharded() ? &pl : nullptr;
}
}  // namespace

MuonLayout muon_layout(const ModelSpec& spec, int tp) {
  MuonLayout out;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    if (!spec.is_hidden_matrix(i)) continue;
    const ParamSpec& p = spec.params[i];
    MuonMatrix mm{i, p.shape, -1};
    if (const Placement* pl = tp_shard(p, tp)) {
      mm.whole = p.shape.with_dim(pl->dim, p.shape[pl->dim] * tp);
      out.tp_local = std::max(out.tp_local, p.shape.numel());
      if (pl->dim != 0) out.tp_staging = std::max(out.tp_staging, mm.whole.numel());
    }
    out.matrices.push_back(mm);
  }
  return out;
}

void DataParallel::make_optimizer(const OptimizerConfig& cfg, std::vector<OptimizerSlot> slots) {
  MuonLayout muon;
  if (cfg.type == OptimizerType::muon) {
    muon = muon_layout(model_.spec(), mesh_.size(Axis::tp));
    for (MuonMatrix& mm : muon.matrices)
      for (size_t k = 0; k < slots.size(); ++k)
        if (slots[k].param == mm.param) mm.slot = static_cast<int>(k);
    // Both count as the optimizer's (persistent, like Muon's own buffers).
    tp_local_ = alloc_.allocate(static_cast<size_t>(muon.tp_local) * 4, MemCategory::optimizer);
    tp_staging_ = alloc_.allocate(static_cast<size_t>(muon.tp_staging) * 4, MemCategory::optimizer);
  }
  opt_.emplace(cfg, alloc_, std::move(slots), std::move(muon.matrices), this);
}

void DataParallel::gather(size_t param, Tensor rows, Tensor whole) {
  const ParamSpec& p = model_.spec().params[param];
  const Placement* pl = tp_shard(p, mesh_.size(Axis::tp));
  if (!pl) {
    gather_rows(param, rows, whole);
    return;
  }
  Communicator& tp = mesh_.comm(Axis::tp);
  Tensor local = tp_local_.tensor(p.shape, DType::f32);
  gather_rows(param, rows, local);
  if (pl->dim == 0) {  // [shard 0; shard 1; ...]: the rows, each rank's in order
    tp.all_gather(whole, local).wait();
    return;
  }
  // Shard(1): (tp, m, n/tp) gathered, then rank t's columns into column block t of (m, n).
  const int64_t m = p.shape[0], nl = p.shape[1], n = tp.size();
  Tensor staging = tp_staging_.tensor({n, m, nl}, DType::f32);
  tp.all_gather(staging, local).wait();
  for (int64_t t = 0; t < n; ++t)
    ops::copy_heads(whole.view({1, m, n, nl}), t, staging.rows(t, t + 1).view({1, m, 1, nl}), 0, 1);
}

void DataParallel::take_rows(size_t param, Tensor whole, Tensor rows) {
  const ParamSpec& p = model_.spec().params[param];
  const Placement* pl = tp_shard(p, mesh_.size(Axis::tp));
  if (!pl) {
    take_local_rows(param, whole, rows);
    return;
  }
  const int64_t t = mesh_.comm(Axis::tp).rank(), m = p.shape[0], nl = p.shape[1];
  Tensor local = tp_local_.tensor(p.shape, DType::f32);
  if (pl->dim == 0)
    ops::copy(local, whole.rows(t * m, (t + 1) * m));
  else
    ops::copy_heads(local.view({1, m, 1, nl}), 0, whole.view({1, m, whole.size(1) / nl, nl}), t, 1);
  take_local_rows(param, local, rows);
}

double DataParallel::take_wait_seconds() {
  const double s = group_.wait_seconds();
  group_.reset_wait_seconds();
  return s;
}

ModelStorage model_storage(int64_t zero_stage, DType compute, DType grads) {
  return ModelStorage{zero_stage < 3, zero_stage < 2,
                      compute == DType::f32 || zero_stage == 0 || zero_stage == 3, grads};
}

std::unique_ptr<DataParallel> make_data_parallel(const ParallelConfig& cfg,
                                                 const OptimizerConfig& opt, Mesh& mesh,
                                                 Transformer& model, Allocator& alloc,
                                                 uint64_t seed) {
  Communicator& group = mesh.group({Axis::dp, Axis::cp});
  if (cfg.zero_stage == 0)
    return std::make_unique<DistributedDataParallel>(cfg, opt, mesh, group, model, alloc);
  return std::make_unique<Zero>(cfg, opt, mesh, group, model, alloc, seed);
}

std::vector<DistributedDataParallel::Bucket> make_buckets(
    const Transformer& model, int64_t bucket_bytes, const std::function<int(size_t)>& group_of) {
  const auto group = [&](size_t i) { return group_of ? group_of(i) : 0; };
  // Offsets of each parameter in the flat buffer, and the block that completes it.
  const auto& params = model.spec().params;
  std::vector<int64_t> offset(params.size() + 1, 0);
  for (size_t i = 0; i < params.size(); ++i) offset[i + 1] = offset[i] + params[i].shape.numel();
  std::vector<int> block_of(params.size(), 0);
  for (int b = 0; b < model.num_blocks(); ++b) {
    const auto [first, last] = model.block_params(b);
    for (size_t i = first; i < last; ++i) block_of[i] = b;
  }
  std::vector<DistributedDataParallel::Bucket> buckets;
  const int64_t max_elems = std::max<int64_t>(1, bucket_bytes / 4);
  size_t end = params.size();
  while (end > 0) {
    size_t begin = end;
    int ready = model.num_blocks();
    const int g = group(end - 1);
    do {
      --begin;
      ready = std::min(ready, block_of[begin]);
    } while (begin > 0 && offset[end] - offset[begin] < max_elems && group(begin - 1) == g);
    buckets.push_back({offset[begin], offset[end], ready, g});
    end = begin;
  }
  return buckets;
}

DistributedDataParallel::DistributedDataParallel(const ParallelConfig& cfg,
                                                 const OptimizerConfig& opt, Mesh& mesh,
                                                 Communicator& group, Transformer& model,
                                                 Allocator& alloc)
    : DataParallel(mesh, group, model, alloc) {
  const ModelSpec& spec = model.spec();
  for (const Communicator* g : grad_groups_) syncs_ = syncs_ || (g && g->size() > 1);
  buckets_ = make_buckets(model, static_cast<int64_t>(cfg.bucket_mb * 1024 * 1024),
                          [&](size_t i) { return spec.grad_group(i).index(); });
  // The optimizer owns every parameter whole.
  std::vector<OptimizerSlot> slots;
  for (size_t i = 0; i < model.params().size(); ++i)
    slots.push_back({i, 0, model.params()[i], model.grads()[i], model.spec().params[i].decay});
  make_optimizer(opt, std::move(slots));
}

// The optimizer's slot of a parameter is the whole tensor on every rank.
void DistributedDataParallel::gather_rows(size_t i, Tensor rows, Tensor local) {
  (void)i;
  ops::copy(local, rows);
}

void DistributedDataParallel::take_local_rows(size_t i, Tensor local, Tensor rows) {
  (void)i;
  ops::copy(rows, local);
}

void DistributedDataParallel::start_step() {
  model_.zero_grads();
  next_bucket_ = 0;
  pending_.clear();
}

void DistributedDataParallel::before_backward(int block) {
  (void)block;
  // MPI advances non-blocking collectives only inside MPI calls: give the buckets in flight a
  // turn before and after each block's backward.
  for (Handle& h : pending_) h.poll();
}

void DistributedDataParallel::after_backward(int block) {
  if (!last_micro_ || !syncs_) return;
  Tensor flat = model_.flat_grads();
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready_block >= block) {
    const Bucket& b = buckets_[next_bucket_++];
    const Tensor view = flat.rows(b.begin, b.end);  // (flat is 1-D, f32 or 16-bit)
    Communicator& g = *grad_groups_[static_cast<size_t>(b.group)];
    if (g.size() > 1) pending_.push_back(g.all_reduce(view));
  }
  for (Handle& h : pending_) h.poll();
}

void DistributedDataParallel::finish_backward() {
  for (Handle& h : pending_) h.wait();
  pending_.clear();
  LLMT_CHECK(!syncs_ || next_bucket_ == buckets_.size(), "DDP: ", next_bucket_, " of ",
             buckets_.size(), " buckets were started; was the last micro-batch marked?");
}

double DistributedDataParallel::grad_norm() {
  if (ep_group_) {
    // The parameters not sharded over ep are the same on every rank of the ep group; its ranks'
    // experts together are the layer's. Under tp: each tp rank's shards, a replicated parameter
    // (the experts too) on tp rank 0 only.
    const ModelSpec& spec = model_.spec();
    double sums[2] = {0, 0};
    for (size_t i = 0; i < model_.grads().size(); ++i)
      if (counts_in_tp_norm(spec, i))  // (pp: the last stage's copy of wte counts on stage 0)
        sums[spec.grad_group(i).ep ? 1 : 0] += ops::sum_squares(model_.grads()[i]);
    ep_group_->all_reduce(Tensor(&sums[1], {1}, DType::f64)).wait();
    double sum = sums[0] + sums[1];
    if (mesh_.size(Axis::tp) > 1)
      mesh_.comm(Axis::tp).all_reduce(Tensor(&sum, {1}, DType::f64)).wait();
    return std::sqrt(sum);
  }
  if (mesh_.size(Axis::tp) == 1 && mesh_.size(Axis::pp) == 1)
    return global_norm({model_.flat_grads()});
  // Under tp: this rank's slices of the sharded parameters, the replicated ones once; under pp
  // without a tied copy of wte (tp_params.h). The trainer sums the stages' norms over pp.
  double sum = tp_sum_squares(model_.spec(), model_.flat_grads());
  mesh_.comm(Axis::tp).all_reduce(Tensor(&sum, {1}, DType::f64)).wait();
  return std::sqrt(static_cast<double>(sum));
}

bool DistributedDataParallel::grads_nonfinite() {
  int32_t bad = ops::has_nonfinite(model_.flat_grads()) ? 1 : 0;
  if (mesh_.size(Axis::tp) > 1)
    mesh_.comm(Axis::tp).all_reduce(Tensor(&bad, {1}, DType::i32), ReduceOp::max).wait();
  if (ep_group_) ep_group_->all_reduce(Tensor(&bad, {1}, DType::i32), ReduceOp::max).wait();
  return bad != 0;
}

void DataParallel::update_owned(size_t i,
                                const std::function<void(Tensor rows, int64_t row_begin)>& update) {
  for (const OptimizerSlot& s : opt_->slots())
    if (s.param == i) update(s.value, s.row_begin);
}

void DataParallel::balance_expert_biases(const std::vector<double>& loads, float rate) {
  const ModelSpec& ms = model_.spec();
  const MoeConfig& e = ms.cfg.moe;
  const int64_t E = e.num_experts;
  std::vector<int64_t> layers = ms.layers();
  for (const int64_t l : ms.mtp_layers()) layers.push_back(l);
  for (const int64_t l : layers) {
    if (!e.layer(l)) continue;
    const double* load = loads.data() + l * E;
    const double mean = std::accumulate(load, load + E, 0.0) / static_cast<double>(E);
    const size_t i = ms.index_of("layers." + std::to_string(l) + ".mlp.router.expert_bias");
    update_owned(i, [&](Tensor rows, int64_t row0) {
      std::vector<float> delta(static_cast<size_t>(rows.numel()));
      for (size_t r = 0; r < delta.size(); ++r) {
        const double d = mean - load[row0 + static_cast<int64_t>(r)];
        delta[r] = d > 0 ? rate : d < 0 ? -rate : 0.0f;
      }
      Buffer buf = alloc_.allocate(delta.size() * 4, MemCategory::other);
      alloc_.backend().copy_from_host(buf.data(), delta.data(), delta.size() * 4);
      ops::add_inplace(rows, buf.tensor(rows.shape, DType::f32));
    });
  }
}

void DistributedDataParallel::step(double lr, int64_t t, float grad_scale) {
  opt_->step(lr, t, grad_scale);
  model_.sync_compute_weights();
}

void DistributedDataParallel::gather_params(std::vector<float>& out) {
  Tensor flat = model_.flat_params();
  out.resize(static_cast<size_t>(flat.numel()));
  alloc_.backend().copy_to_host(out.data(), flat.data, flat.nbytes());
  std::vector<float> local;
  if (ep_group_) {  // the experts over ep, then the tp shards over tp
    local.swap(out);
    gather_ep_params(*ep_group_, model_.spec(), local, out);
  }
  if (mesh_.size(Axis::tp) > 1) {
    local.swap(out);
    gather_tp_params(mesh_.comm(Axis::tp), model_.spec().without_ep(), local, out);
  }
}

}  // namespace llmt
