// ZeRO 1-3 (see zero.h for the layout and the schedule of collectives per stage).
#include "engine/data_parallel/zero.h"

#include <algorithm>
#include <cmath>

#include "core/file_memory.h"
#include "core/rng.h"
#include "engine/data_parallel/tp_params.h"
#include "kernels/ops.h"

namespace llmt {

Zero::Zero(const ParallelConfig& cfg, const OptimizerConfig& opt, Mesh& mesh, Communicator& group,
           Transformer& model, Allocator& alloc, uint64_t seed)
    : DataParallel(mesh, group, model, alloc),
      ZeroSequence(static_cast<int>(cfg.zero_stage), model.num_blocks() - 2) {
  LLMT_CHECK(zero_stage() >= 1 && zero_stage() <= 3, "zero_stage ", zero_stage());
  const ModelSpec& spec = model.spec();
  LLMT_CHECK(spec.ep_size == cfg.ep, "the model holds experts for ep=", spec.ep_size,
             ", parallel.ep=", cfg.ep);
  // Hybrid sharding: each part shards within its chunk of dp/zero_shard_group chunks
  // (Mesh::zero_shard_group), made in part order on every rank (the splits are collectives).
  const int dp = mesh.size(Axis::dp);
  LLMT_CHECK(
      cfg.zero_shard_group == 0 || (cfg.zero_shard_group > 0 && dp % cfg.zero_shard_group == 0),
      "parallel.zero_shard_group=", cfg.zero_shard_group, " does not divide dp=", dp);
  const int replicas = cfg.zero_shard_group > 0 ? dp / static_cast<int>(cfg.zero_shard_group) : 1;
  if (replicas > 1) {
    for (int k = 0; k < kParts; ++k) {
      if (!grad_groups_[static_cast<size_t>(k)]) continue;
      const GradGroup g = GradGroup::of_index(k);
      grad_groups_[static_cast<size_t>(k)] = &mesh.zero_shard_group(g, spec.ep_size, replicas);
      replica_[static_cast<size_t>(k)] = &mesh.zero_replica_group(g, spec.ep_size, replicas);
    }
  }
  if (cfg.zero_quantized_weights) quant_block_ = cfg.zero_quant_block;
  LLMT_CHECK(quant_block_ == 0 || zero_stage() == 3, "qwZ quantises ZeRO-3's gathers, not stage ",
             zero_stage(), "'s");
  // The units' parameters, parts and rows (zero_layout.h) over part 0's group (dp x cp, or its
  // chunk), checked against the parts' groups.
  const Communicator& shard0 = *grad_groups_[0];
  const ZeroLayout layout = zero_layout(spec, num_layers(), shard0.size(), shard0.rank());
  for (int k = 0; k < kParts; ++k) {
    const Communicator* g = grad_groups_[static_cast<size_t>(k)];
    n_[k] = g ? g->size() : 1;
    rank_[k] = g ? g->rank() : 0;
    LLMT_CHECK(!layout.used[k] || (g && layout.n[k] == n_[k] && layout.rank[k] == rank_[k]),
               "ZeRO's part ", k, " group has ", n_[k], " ranks (this one number ", rank_[k],
               "), the checkpoint layout expects ", layout.n[k], " (number ", layout.rank[k], ")");
  }
  units_.resize(layout.units.size());
  for (int b = 0; b < model.num_blocks(); ++b)
    units_[static_cast<size_t>(unit_of(b))].blocks.push_back(b);
  int64_t shard_total = 0;
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    Unit& u = units_[ui];
    const ZeroUnit& lu = layout.units[ui];
    u.params = lu.params;
    u.full_numel = lu.full_numel;
    // The blocks' offsets in the gathered layout: the layout is in spec order, as the blocks.
    std::sort(u.blocks.begin(), u.blocks.end());
    int64_t off = 0;
    for (int b : u.blocks) {
      u.block_off.push_back(off);
      const auto [first, last] = model.block_params(b);
      for (size_t i = first; i < last; ++i) off += spec.params[i].shape.numel();
    }
    LLMT_CHECK(off == u.full_numel, "ZeRO unit ", ui, ": its blocks hold ", off,
               " elements, its layout ", u.full_numel);
    for (int k = 0; k < kParts; ++k)
      u.parts[static_cast<size_t>(k)].shard_numel = lu.shard_numel[k];
    for (Part& part : u.parts) {
      part.shard_begin = shard_total;
      shard_total += part.shard_numel;
    }
  }
  // hpZ: the secondary groups (chunks of N dp ranks, as hybrid sharding cuts), the units cut
  // over them, and a buffer for every unit's secondary rows.
  if (cfg.zero_hierarchical_partition > 0) {
    const int64_t hn = cfg.zero_hierarchical_partition;
    LLMT_CHECK(zero_stage() == 3 && dp % hn == 0, "parallel.zero_hierarchical_partition=", hn,
               " needs ZeRO-3 and dp=", dp, " divisible by it");
    const int chunks = dp / static_cast<int>(hn);
    for (int k = 0; k < kParts; ++k) {
      if (!grad_groups_[static_cast<size_t>(k)]) continue;
      Communicator& g2 = mesh.zero_shard_group(GradGroup::of_index(k), spec.ep_size, chunks);
      secondary_group_[static_cast<size_t>(k)] = &g2;
      n2_[k] = g2.size();
      rank2_[k] = g2.rank();
    }
    const ZeroLayout sec = zero_layout(spec, num_layers(), n2_[0], rank2_[0]);
    for (int k = 0; k < kParts; ++k)
      LLMT_CHECK(!sec.used[k] || (sec.n[k] == n2_[k] && sec.rank[k] == rank2_[k]), "hpZ's part ", k,
                 " group has ", n2_[k], " ranks, its layout expects ", sec.n[k]);
    int64_t total = 0;
    for (size_t ui = 0; ui < units_.size(); ++ui) {
      units_[ui].secondary = sec.units[ui];
      for (int k = 0; k < kParts; ++k) {
        units_[ui].secondary_begin[static_cast<size_t>(k)] = total;
        total += sec.units[ui].shard_numel[static_cast<size_t>(k)];
      }
    }
    const DType t = model.compute_dtype();
    secondary_ = alloc.allocate(static_cast<size_t>(total) * dtype_size(t), MemCategory::params);
    ops::fill_zero(secondary_.tensor({total}, t));  // (padding rows: gathered, never read)
  }
  // qgZ: the first hop within groups of zero_quantized_gradients_group dp ranks (by default hpZ's)
  // where they cut the shard group (then the second across them, among the ranks at the same
  // place), else one hop over the shard group.
  if (cfg.zero_quantized_gradients) {
    LLMT_CHECK(zero_stage() == 3, "qgZ quantises ZeRO-3's reduce-scatters, not stage ",
               zero_stage(), "'s");
    grad_quant_block_ = cfg.zero_quant_block;
    const int64_t hop = cfg.zero_quantized_gradients_group > 0 ? cfg.zero_quantized_gradients_group
                                                               : cfg.zero_hierarchical_partition;
    LLMT_CHECK(hop == 0 || dp % hop == 0, "qgZ's first hop of ", hop,
               " dp ranks does not divide dp=", dp);
    for (int k = 0; k < kParts; ++k) {
      const size_t kk = static_cast<size_t>(k);
      if (!grad_groups_[kk]) continue;
      const int chunks = hop > 0 ? dp / static_cast<int>(hop) : 1;
      Communicator* inner =
          hop > 0 ? &mesh.zero_shard_group(GradGroup::of_index(k), spec.ep_size, chunks) : nullptr;
      if (inner && inner->size() < n_[k]) {
        qg1_[kk] = inner;
        qg2_[kk] = &mesh.zero_cross_group(GradGroup::of_index(k), spec.ep_size, replicas, chunks);
        LLMT_CHECK(qg1_[kk]->size() * qg2_[kk]->size() == n_[k], "qgZ's hops over ",
                   qg1_[kk]->size(), " and ", qg2_[kk]->size(), " ranks, its group has ", n_[k]);
      } else {
        qg1_[kk] = grad_groups_[kk];
      }
    }
  }
  const size_t shard_bytes = static_cast<size_t>(shard_total) * 4;
  const DType gt = model.storage().grad_dtype;  // the gradients' type: f32 or 16-bit
  if (zero_stage() >= 2)
    grad_shard_ =
        alloc.allocate(static_cast<size_t>(shard_total) * dtype_size(gt), MemCategory::grads);
  // The fp32 master weights are this rank's shard rows at stage 3, and at stages 1-2 in 16-bit
  // precision, where the model's weights are the compute copy (ModelStorage::master).
  master_shards_ = zero_stage() == 3 || !model.storage().master;
  LLMT_CHECK(zero_stage() == 3 || model.storage().master || model.compute_dtype() != DType::f32,
             "ZeRO-", zero_stage(), ": an fp32 model keeps its master weights");
  if (master_shards_) {
    // [offload]: ZeRO-3's shards with the parameters, the masters of 16-bit stages 1-2 with the
    // optimizer's state.
    param_shard_ =
        alloc.allocate(shard_bytes, MemCategory::params,
                       zero_stage() == 3 ? Offload::with_params : Offload::with_optimizer);
    init_shards(seed);
  }

  // The optimizer over this rank's real rows.
  std::vector<OptimizerSlot> slots;
  for (const Unit& u : units_) {
    for (const Param& p : u.params) {
      if (p.own_rows == 0) continue;
      const int64_t row0 = rank_[p.part] * p.shard_rows;
      slots.push_back(
          {p.index, row0,
           master_shards_
               ? shard_rows(param_shard_.tensor({shard_total}, DType::f32), u, p, p.own_rows)
               : as_rows(model.params()[p.index], p).rows(row0, row0 + p.own_rows),
           zero_stage() >= 2 ? shard_rows(grad_shard_.tensor({shard_total}, gt), u, p, p.own_rows)
                             : as_rows(model.grads()[p.index], p).rows(row0, row0 + p.own_rows),
           spec.params[p.index].decay});
    }
  }
  param_at_.assign(spec.params.size(), {0, 0});
  int64_t shard = 0, gathered = 0;  // Muon: the largest hidden matrix's shard, and n of them
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t k = 0; k < units_[u].params.size(); ++k) {
      const Param& p = units_[u].params[k];
      param_at_[p.index] = {u, k};
      if (opt.type == OptimizerType::muon && spec.is_hidden_matrix(p.index)) {
        shard = std::max(shard, p.shard_rows * p.row_numel);
        gathered = std::max(gathered, p.shard_rows * p.row_numel * n_[p.part]);
      }
    }
  if (gathered > 0) {  // (counted as the optimizer's, as its other buffers)
    gather_send_ = alloc.allocate(static_cast<size_t>(shard) * 4, MemCategory::optimizer);
    gather_staging_ = alloc.allocate(static_cast<size_t>(gathered) * 4, MemCategory::optimizer);
  }
  make_optimizer(opt, std::move(slots));
}

const Zero::Param& Zero::param_of(size_t i) const {
  const auto [u, k] = param_at_.at(i);
  return units_[u].params[k];
}

void Zero::gather_rows(size_t i, Tensor rows, Tensor local) {
  const Param& p = param_of(i);
  const int n = n_[p.part];
  const int64_t shard = p.shard_rows * p.row_numel;
  Tensor send = gather_send_.tensor({p.shard_rows, p.row_numel}, DType::f32);
  ops::fill_zero(send);  // the padding rows past the real ones
  if (rows.defined()) ops::copy(send.rows(0, p.own_rows), rows.view({p.own_rows, p.row_numel}));
  Tensor all = gather_staging_.tensor({n * shard}, DType::f32);
  grad_groups_[static_cast<size_t>(p.part)]->all_gather(all, send.view({shard})).wait();
  ops::copy(local.view({p.rows * p.row_numel}), all.rows(0, p.rows * p.row_numel));
}

void Zero::take_local_rows(size_t i, Tensor local, Tensor rows) {
  const Param& p = param_of(i);
  const int64_t row0 = rank_[p.part] * p.shard_rows;
  ops::copy(rows.view({p.own_rows, p.row_numel}), as_rows(local, p).rows(row0, row0 + p.own_rows));
}

// Param p's tensor `t` (its shape) as the rows ZeRO cuts it into (ModelSpec::cut_rows): itself,
// or for an expert stack a (rows, row_numel) view.
Tensor Zero::as_rows(Tensor t, const Param& p) {
  return t.shape[0] == p.rows ? t : t.view({p.rows, p.row_numel});
}

// The first `rows` rows of param p's shard inside a shard buffer.
Tensor Zero::shard_rows(Tensor shard_buf, const Unit& u, const Param& p, int64_t rows) const {
  const Shape& shape = model_.spec().params[p.index].shape;
  const int64_t at = u.parts[static_cast<size_t>(p.part)].shard_begin + p.shard_off;
  return as_rows(Tensor(static_cast<char*>(shard_buf.data) + at * dtype_size(shard_buf.dtype),
                        shape, shard_buf.dtype, shard_buf.device),
                 p)
      .rows(0, rows);
}

void Zero::stream_shards(size_t unit, bool ahead) {
  FileStore* store = alloc_.file_store();
  if (!store || unit >= units_.size()) return;
  for (const Part& part : units_[unit].parts) {
    const float* p = static_cast<const float*>(param_shard_.data()) + part.shard_begin;
    const size_t n = static_cast<size_t>(part.shard_numel) * 4;
    if (ahead)
      store->read_ahead(p, n);
    else
      store->drop(p, n);
  }
}

void Zero::init_shards(uint64_t seed) {
  Tensor all = param_shard_.tensor({static_cast<int64_t>(param_shard_.bytes() / 4)}, DType::f32);
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    for (const Param& p : u.params) {
      if (p.own_rows == 0) continue;
      // The dp shard's rows of this tp rank's tensor, each element from its global index.
      init_param_rows(model_.spec(), p.index, shard_rows(all, u, p, p.own_rows),
                      rank_[p.part] * p.shard_rows, seed);
    }
    stream_shards(k, false);  // (offloaded: written; out of memory unit by unit)
  }
}

Zero::Cut Zero::primary_cut(const Unit& u, int part) const {
  return {&u.params, u.parts[static_cast<size_t>(part)].shard_numel, n_[part], rank_[part]};
}

Zero::Cut Zero::secondary_cut(const Unit& u, int part) const {
  return {&u.secondary.params, u.secondary.shard_numel[static_cast<size_t>(part)], n2_[part],
          rank2_[part]};
}

void Zero::pack(Tensor dst, const Cut& c, int part, const std::vector<Tensor>& views,
                bool all_ranks, int chunk) {
  const int me = c.me, n = c.n;
  const int64_t numel = c.numel;
  const size_t es = dtype_size(dst.dtype);  // f32, or 16-bit compute weights
  for (int r = all_ranks ? 0 : me; r < (all_ranks ? n : me + 1); ++r) {
    const int64_t at = chunk > 0 ? (r % chunk) * (n / chunk) + r / chunk : r;
    char* block = static_cast<char*>(dst.data) + (all_ranks ? at * numel : 0) * es;
    for (const Param& p : *c.params) {
      const int64_t own = p.part == part ? p.own_rows_of(r) : 0;
      if (own == 0) continue;
      Tensor from = as_rows(views[p.index], p).rows(r * p.shard_rows, r * p.shard_rows + own);
      ops::copy(Tensor(block + p.shard_off * es, from.shape, dst.dtype, dst.device), from);
    }
  }
}

void Zero::unpack(const std::vector<Tensor>& views, Tensor src, const Cut& c, int part) {
  const int64_t numel = c.numel;
  const size_t es = dtype_size(src.dtype);  // f32, or 16-bit compute weights
  for (int r = 0; r < c.n; ++r) {
    char* block = static_cast<char*>(src.data) + r * numel * es;
    for (const Param& p : *c.params) {
      const int64_t own = p.part == part ? p.own_rows_of(r) : 0;
      if (own == 0) continue;
      Tensor to = as_rows(views[p.index], p).rows(r * p.shard_rows, r * p.shard_rows + own);
      ops::copy(to, Tensor(block + p.shard_off * es, to.shape, src.dtype, src.device));
    }
  }
}

// Spec-indexed views of a unit's params inside its gathered buffer (other entries empty).
std::vector<Tensor> Zero::unit_views(const Unit& u, Tensor gathered) const {
  std::vector<Tensor> views(model_.spec().params.size());
  const size_t es = dtype_size(gathered.dtype);
  for (const Param& p : u.params)
    views[p.index] = Tensor(static_cast<char*>(gathered.data) + p.full_off * es,
                            model_.spec().params[p.index].shape, gathered.dtype, gathered.device);
  return views;
}

// ---- stage 3: gathering parameters ----

void Zero::start_gather(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  // Empty units: a pipeline stage's layers held by other stages (and its root, but for the
  // first and last stage).
  if (u.params.empty() || u.gathered.data()) return;
  for (const Part& part : u.parts)
    if (!part.gather.done()) return;
  // The gathered weights are the compute copy: in 16-bit precision the shards are rounded to
  // the compute type first and gathered in 16 bits.
  const DType t = model_.compute_dtype();
  const size_t es = dtype_size(t);
  if (u.secondary_valid) {  // hpZ: the secondary rows, within the chunk
    for (int k = 0; k < kParts; ++k) {
      Part& part = u.parts[static_cast<size_t>(k)];
      const Cut c = secondary_cut(u, k);
      if (c.numel == 0) continue;
      part.staging = alloc_.allocate(static_cast<size_t>(c.numel * c.n) * es, MemCategory::comm);
      const Tensor in(static_cast<char*>(secondary_.data()) +
                          u.secondary_begin[static_cast<size_t>(k)] * static_cast<int64_t>(es),
                      {c.numel}, t, alloc_.device());
      part.gather = secondary_group_[static_cast<size_t>(k)]->all_gather(
          part.staging.tensor({c.numel * c.n}, t), in);
      part.from_secondary = true;
    }
    return;
  }
  // Offloaded shards: the units gathered next either way start coming in from the files.
  stream_shards(static_cast<size_t>(unit) + 1, true);
  if (unit > 0) stream_shards(static_cast<size_t>(unit) - 1, true);
  for (int k = 0; k < kParts; ++k) {
    Part& part = u.parts[static_cast<size_t>(k)];
    if (part.shard_numel == 0) continue;
    const int64_t numel = part.shard_numel * n_[k];
    Tensor in(static_cast<float*>(param_shard_.data()) + part.shard_begin, {part.shard_numel},
              DType::f32, alloc_.device());
    Communicator& g = *grad_groups_[static_cast<size_t>(k)];
    if (quant_block_ > 0) {  // qwZ: int8 blocks of the fp32 master rows
      const int64_t w = ops::int_packed_words(part.shard_numel, quant_block_, 8);
      part.send = alloc_.allocate(static_cast<size_t>(w) * 4, MemCategory::comm);
      part.packed = alloc_.allocate(static_cast<size_t>(w * n_[k]) * 4, MemCategory::comm);
      ops::quantize_int(part.send.tensor({1, w}, DType::i32), in.view({1, part.shard_numel}),
                        quant_block_, 8);
      part.gather = g.all_gather(part.packed.tensor({w * n_[k]}, DType::i32),
                                 part.send.tensor({w}, DType::i32));
      continue;
    }
    part.staging = alloc_.allocate(static_cast<size_t>(numel) * es, MemCategory::comm);
    if (t != DType::f32) {
      part.send = alloc_.allocate(static_cast<size_t>(part.shard_numel) * es, MemCategory::comm);
      const Tensor rounded = part.send.tensor({part.shard_numel}, t);
      ops::convert(rounded, in);
      in = rounded;
    }
    part.gather = g.all_gather(part.staging.tensor({numel}, t), in);
  }
}

void Zero::finish_gather(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  if (u.params.empty() || u.gathered.data()) return;
  start_gather(unit);
  const DType t = model_.compute_dtype();  // the compute copy's type (16 bits in bf16/fp16)
  u.gathered =
      alloc_.allocate(static_cast<size_t>(u.full_numel) * dtype_size(t), MemCategory::comm);
  Tensor g = u.gathered.tensor({u.full_numel}, t);
  const std::vector<Tensor> views = unit_views(u, g);
  for (int k = 0; k < kParts; ++k) {
    Part& part = u.parts[static_cast<size_t>(k)];
    if (part.shard_numel == 0) continue;
    part.gather.wait();
    if (part.from_secondary) {  // hpZ: the secondary rows of the group's ranks
      const Cut c = secondary_cut(u, k);
      unpack(views, part.staging.tensor({c.numel * c.n}, t), c, k);
      part.from_secondary = false;
      part.staging.reset();
      continue;
    }
    if (quant_block_ > 0) {  // every rank's int8 blocks back into the compute type
      const int64_t w = ops::int_packed_words(part.shard_numel, quant_block_, 8);
      part.staging = alloc_.allocate(static_cast<size_t>(part.shard_numel * n_[k]) * dtype_size(t),
                                     MemCategory::comm);
      ops::dequantize_int(part.staging.tensor({n_[k], part.shard_numel}, t),
                          part.packed.tensor({n_[k], w}, DType::i32), quant_block_, 8);
      part.packed.reset();
      part.send.reset();
    }
    unpack(views, part.staging.tensor({part.shard_numel * n_[k]}, t), primary_cut(u, k), k);
    part.staging.reset();
    part.send.reset();
  }
  stream_shards(static_cast<size_t>(unit), false);  // (offloaded: read; out of memory again)
  if (secondary_.data() && !u.secondary_valid) fill_secondary(u, views);
  for (size_t k = 0; k < u.blocks.size(); ++k)
    model_.bind_block(u.blocks[k], g.rows(u.block_off[k], u.full_numel), Tensor());
}

// hpZ: this rank's secondary rows of each part, from the unit's gathered weights.
void Zero::fill_secondary(Unit& u, const std::vector<Tensor>& views) {
  const DType t = model_.compute_dtype();
  const int64_t es = static_cast<int64_t>(dtype_size(t));
  for (int k = 0; k < kParts; ++k) {
    const Cut c = secondary_cut(u, k);
    if (c.numel == 0) continue;
    pack(Tensor(
             static_cast<char*>(secondary_.data()) + u.secondary_begin[static_cast<size_t>(k)] * es,
             {c.numel}, t, alloc_.device()),
         c, k, views, false);
  }
  u.secondary_valid = true;
}

void Zero::release_gather(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  for (Part& part : u.parts) {
    part.gather.wait();
    part.staging.reset();
    part.send.reset();
    part.packed.reset();
    part.from_secondary = false;
  }
  u.gathered.reset();
  stream_shards(static_cast<size_t>(unit), false);
}

// ---- gradients ----

void Zero::start_reduce(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  if (u.params.empty()) return;
  const DType gt = model_.storage().grad_dtype;  // reduce-scattered in the gradients' type
  const size_t es = dtype_size(gt);
  for (int k = 0; k < kParts; ++k) {
    const int64_t numel = u.parts[static_cast<size_t>(k)].shard_numel;
    if (numel == 0) continue;
    Reduction red;
    red.unit = unit;
    red.part = k;
    red.packed = alloc_.allocate(static_cast<size_t>(numel * n_[k]) * es, MemCategory::comm);
    red.out = alloc_.allocate(static_cast<size_t>(numel) * es, MemCategory::comm);
    const Tensor packed = red.packed.tensor({numel * n_[k]}, gt);
    Communicator* second = qg2_[static_cast<size_t>(k)];
    pack(packed, primary_cut(u, k), k, model_.grads(), true,
         second ? qg1_[static_cast<size_t>(k)]->size() : 0);
    if (grad_quant_block_ > 0)
      start_quantized(red, packed);
    else
      red.handle =
          grad_groups_[static_cast<size_t>(k)]->reduce_scatter(red.out.tensor({numel}, gt), packed);
    reductions_.push_back(std::move(red));
  }
  u.grad_staging.reset();  // stages 2-3: the gradients now live in `packed`
  // At most two units' reductions in flight: bounds the packed staging to two units.
  complete_reductions(2);
}

// qgZ's int4 blocks: each of the n ranks' (padded) shards of the part quantised as a row of its
// own, in the order pack laid them out (for two hops, by the owner's place in its chunk), sent
// to the first hop's ranks (n / its size rows each).
void Zero::start_quantized(Reduction& red, Tensor packed) {
  const size_t k = static_cast<size_t>(red.part);
  const int n = n_[k];
  const int64_t numel = packed.numel() / n, w = ops::int_packed_words(numel, grad_quant_block_, 4);
  red.send = alloc_.allocate(static_cast<size_t>(n * w) * 4, MemCategory::comm);
  ops::quantize_int(red.send.tensor({n, w}, DType::i32), packed.view({n, numel}), grad_quant_block_,
                    4);
  red.packed.reset();
  red.recv = alloc_.allocate(static_cast<size_t>(n * w) * 4, MemCategory::comm);
  red.handle = qg1_[k]->all_to_all(red.recv.tensor({n * w}, DType::i32),
                                   red.send.tensor({n * w}, DType::i32));
  red.hop = 1;
}

namespace {
// rows (S, L) f32: row 0 += rows 1..S-1, in order.
void sum_rows_into_first(Tensor rows) {
  for (int64_t r = 1; r < rows.shape[0]; ++r)
    ops::add_inplace(rows.rows(0, 1), rows.rows(r, r + 1));
}
}  // namespace

// qgZ's second hop: the first hop brought, from each of the chunk's n1 ranks, the C = n / n1
// blocks owned by the ranks at this rank's place (one per chunk); their sums, quantised again,
// go to those ranks (the cross group, in chunk order).
void Zero::advance(Reduction& red) {
  const size_t k = static_cast<size_t>(red.part);
  if (red.hop != 1 || !qg2_[k]) return;
  red.handle.wait();
  red.send.reset();
  const int n = n_[k], n1 = qg1_[k]->size(), C = n / n1;
  const int64_t numel = units_[static_cast<size_t>(red.unit)].parts[k].shard_numel,
                w = ops::int_packed_words(numel, grad_quant_block_, 4);
  Buffer deq = alloc_.allocate(static_cast<size_t>(n * numel) * 4, MemCategory::comm);
  ops::dequantize_int(deq.tensor({n, numel}, DType::f32), red.recv.tensor({n, w}, DType::i32),
                      grad_quant_block_, 4);
  red.recv.reset();
  sum_rows_into_first(deq.tensor({n1, C * numel}, DType::f32));
  red.send = alloc_.allocate(static_cast<size_t>(C * w) * 4, MemCategory::comm);
  ops::quantize_int(red.send.tensor({C, w}, DType::i32),
                    deq.tensor({C * numel}, DType::f32).view({C, numel}), grad_quant_block_, 4);
  deq.reset();
  red.recv = alloc_.allocate(static_cast<size_t>(C * w) * 4, MemCategory::comm);
  red.handle = qg2_[k]->all_to_all(red.recv.tensor({C * w}, DType::i32),
                                   red.send.tensor({C * w}, DType::i32));
  red.hop = 2;
}

// The last hop's blocks (from every rank, or from every chunk), dequantised and summed into `out`.
void Zero::finish_quantized(Reduction& red) {
  const size_t k = static_cast<size_t>(red.part);
  red.handle.wait();
  red.send.reset();
  const int from = red.hop == 2 ? qg2_[k]->size() : n_[k];
  const int64_t numel = units_[static_cast<size_t>(red.unit)].parts[k].shard_numel,
                w = ops::int_packed_words(numel, grad_quant_block_, 4);
  Buffer deq = alloc_.allocate(static_cast<size_t>(from * numel) * 4, MemCategory::comm);
  const Tensor rows = deq.tensor({from, numel}, DType::f32);
  ops::dequantize_int(rows, red.recv.tensor({from, w}, DType::i32), grad_quant_block_, 4);
  red.recv.reset();
  sum_rows_into_first(rows);
  ops::convert(red.out.tensor({numel}, model_.storage().grad_dtype), rows.rows(0, 1).view({numel}));
  red.hop = 0;
}

void Zero::complete_reductions(size_t keep) {
  const auto units_in_flight = [&] {
    size_t n = 0;
    for (size_t k = 0; k < reductions_.size(); ++k)
      n += k == 0 || reductions_[k].unit != reductions_[k - 1].unit;
    return n;
  };
  // A unit's reductions are a run of entries (its parts). qgZ: the second hop of every run's but
  // the newest's (its first hop had a unit's backward to finish in); of the oldest's as it
  // completes (plan's ZeroReplay does the same).
  size_t older = reductions_.size();
  while (older > 0 && reductions_[older - 1].unit == reductions_.back().unit) --older;
  for (size_t i = 0; i < older; ++i) advance(reductions_[i]);
  while (units_in_flight() > keep) {
    Reduction& red = reductions_.front();
    for (size_t i = 0; i < reductions_.size() && reductions_[i].unit == red.unit; ++i)
      advance(reductions_[i]);
    if (red.hop > 0) finish_quantized(red);
    red.handle.wait();
    const Unit& u = units_[static_cast<size_t>(red.unit)];
    const Part& part = u.parts[static_cast<size_t>(red.part)];
    const DType gt = model_.storage().grad_dtype;
    const size_t es = dtype_size(gt);
    Tensor out = red.out.tensor({part.shard_numel}, gt);
    // Hybrid sharding: the step's sum of this rank's rows over the other replicas too.
    Communicator* replica = replica_[static_cast<size_t>(red.part)];
    if (zero_stage() >= 2) {
      Tensor dst(static_cast<char*>(grad_shard_.data()) + part.shard_begin * es, {part.shard_numel},
                 gt, alloc_.device());
      ops::add_inplace(dst, out);
      if (replica && last_micro_batch()) replica_reduces_.push_back(replica->all_reduce(dst));
    } else {
      if (replica) replica->all_reduce(out).wait();  // (stage 1 reduces on the last micro-batch)
      // Stage 1: this rank's reduced rows back into the model's full gradient buffer.
      for (const Param& p : u.params) {
        if (p.own_rows == 0 || p.part != red.part) continue;
        const int64_t row0 = rank_[p.part] * p.shard_rows;
        Tensor to = as_rows(model_.grads()[p.index], p).rows(row0, row0 + p.own_rows);
        ops::copy(
            to, Tensor(static_cast<char*>(out.data) + p.shard_off * es, to.shape, gt, out.device));
      }
    }
    reductions_.pop_front();
  }
}

// ---- hooks ----

void Zero::start_step() {
  model_.zero_grads();
  if (grad_shard_.data())
    ops::fill_zero(
        grad_shard_.tensor({static_cast<int64_t>(grad_shard_.bytes() / 4)}, DType::f32));  // bytes
}

void Zero::start_micro_batch(bool last) {
  on_start_micro_batch(last);
}

void Zero::before_forward(int block) {
  on_before_forward(block);
}

void Zero::before_backward(int block) {
  on_before_backward(block);
}

void Zero::after_backward(int block) {
  on_after_backward(block);
}

void Zero::finish_backward() {
  on_finish_backward();
  for (Handle& h : replica_reduces_) h.wait();
  replica_reduces_.clear();
}

// Besides the dp x cp group's waits, those of the groups hybrid sharding and hpZ split from it.
double Zero::take_wait_seconds() {
  double s = DataParallel::take_wait_seconds();
  for (size_t k = 0; k < kParts; ++k)
    for (Communicator* c :
         {replica_[k] ? grad_groups_[k] : nullptr, replica_[k], secondary_group_[k]}) {
      if (!c || c == &group_) continue;
      s += c->wait_seconds();
      c->reset_wait_seconds();
    }
  return s;
}

bool Zero::holds(int unit) const {
  return !units_[static_cast<size_t>(unit)].params.empty();
}

bool Zero::staged(int unit) const {
  return units_[static_cast<size_t>(unit)].grad_staging.data() != nullptr;
}

// Stages 2-3: the unit's gradients go to a fresh staging buffer (its blocks bound to it).
void Zero::stage_gradients(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  const DType gt = model_.storage().grad_dtype;
  u.grad_staging =
      alloc_.allocate(static_cast<size_t>(u.full_numel) * dtype_size(gt), MemCategory::comm);
  Tensor g = u.grad_staging.tensor({u.full_numel}, gt);
  for (size_t k = 0; k < u.blocks.size(); ++k)
    model_.bind_block(u.blocks[k], Tensor(), g.rows(u.block_off[k], u.full_numel));
}

void Zero::poll() {
  for (Reduction& red : reductions_) red.handle.poll();
}

double Zero::grad_norm() {
  // The optimizer's slots are this rank's real rows; under tp a replicated parameter counts on
  // tp rank 0 only (tp_params.h), but for the routed ones, whose rows are cut over tp too.
  const ModelSpec& spec = model_.spec();
  std::vector<Tensor> counted;
  for (const OptimizerSlot& s : opt_->slots())
    if (counts_in_tp_norm(spec, s.param) || spec.grad_group(s.param).tp) counted.push_back(s.grad);
  double sum = ops::sum_squares(counted);  // reduced in double, as ops.h promises
  // Over part 0's group: dp x cp, or under hybrid sharding the chunk holding one replica of
  // every part's rows.
  grad_groups_[0]->all_reduce(Tensor(&sum, {1}, DType::f64)).wait();
  if (mesh_.size(Axis::tp) > 1)
    mesh_.comm(Axis::tp).all_reduce(Tensor(&sum, {1}, DType::f64)).wait();
  return std::sqrt(static_cast<double>(sum));
}

bool Zero::grads_nonfinite() {
  std::vector<Tensor> grads;
  for (const OptimizerSlot& s : opt_->slots()) grads.push_back(s.grad);
  int32_t bad = ops::has_nonfinite(grads) ? 1 : 0;
  group_.all_reduce(Tensor(&bad, {1}, DType::i32), ReduceOp::max).wait();
  if (mesh_.size(Axis::tp) > 1)
    mesh_.comm(Axis::tp).all_reduce(Tensor(&bad, {1}, DType::i32), ReduceOp::max).wait();
  return bad != 0;
}

void Zero::step(double lr, int64_t t, float grad_scale) {
  opt_->step(lr, t, grad_scale);
  if (zero_stage() == 3) {
    // The shards are the parameters; no gathered copy (nor hpZ's secondary rows) may outlive
    // the update (a forward-only evaluation leaves the root and a prefetch behind). The next
    // forward gathers afresh.
    for (size_t k = 0; k < units_.size(); ++k) release_gather(static_cast<int>(k));
    for (Unit& u : units_) u.secondary_valid = false;
    return;
  }
  // Stages 1-2: every unit's updated rows back into the full parameters (in 16-bit, the compute
  // weights: the master rows rounded, then gathered in 16 bits).
  gather_into(model_.params());
  model_.sync_compute_weights();
}

// All-gathers every unit's master rows into `dst` (spec-indexed views), two units in flight (unit
// k's gather runs while unit k-1 is unpacked), so staging stays two units; each unit's parts in
// turn. The rows come from the master shards, or (stages 1-2 in fp32) from the model's
// parameters, which the optimizer updated in place. 16-bit views (the compute weights of stages
// 1-2) get the master rows rounded to their type, and the all-gather moves 16 bits.
void Zero::gather_into(const std::vector<Tensor>& dst) {
  const DType t = dst.empty() ? DType::f32 : dst.front().dtype;
  const size_t es = dtype_size(t);
  struct InFlight {
    size_t unit;
    int part;
    Buffer in, out;
    Handle handle;
  };
  auto finish = [&](InFlight& f) {
    f.handle.wait();
    stream_shards(f.unit, false);
    const Unit& u = units_[f.unit];
    const int64_t numel = u.parts[static_cast<size_t>(f.part)].shard_numel;
    unpack(dst, f.out.tensor({numel * n_[f.part]}, t), primary_cut(u, f.part), f.part);
  };
  std::optional<InFlight> prev;
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    for (int part = 0; part < kParts; ++part) {
      const Part& pt = u.parts[static_cast<size_t>(part)];
      const int64_t numel = pt.shard_numel, n = n_[part];
      if (numel == 0) continue;
      InFlight cur{k, part, Buffer(),
                   alloc_.allocate(static_cast<size_t>(numel * n) * es, MemCategory::comm),
                   Handle()};
      Tensor in;
      if (master_shards_) {
        in = Tensor(static_cast<float*>(param_shard_.data()) + pt.shard_begin, {numel}, DType::f32,
                    alloc_.device());
        if (t != DType::f32) {
          cur.in = alloc_.allocate(static_cast<size_t>(numel) * es, MemCategory::comm);
          const Tensor rounded = cur.in.tensor({numel}, t);
          ops::convert(rounded, in);
          in = rounded;
        }
      } else {
        cur.in = alloc_.allocate(static_cast<size_t>(numel) * es, MemCategory::comm);
        in = cur.in.tensor({numel}, t);
        pack(in, primary_cut(u, part), part, model_.params(), false);
      }
      cur.handle =
          grad_groups_[static_cast<size_t>(part)]->all_gather(cur.out.tensor({numel * n}, t), in);
      if (prev) finish(*prev);
      prev = std::move(cur);
    }
  }
  if (prev) finish(*prev);
}

void Zero::gather_params(std::vector<float>& out) {
  const ModelSpec& spec = model_.spec();
  // This tp rank's tensors first (spec.params[i].shape), then, under tp, the global ones.
  out.assign(static_cast<size_t>(spec.num_local_params()), 0.0f);
  if (!master_shards_) {
    Tensor flat = model_.flat_params();
    alloc_.backend().copy_to_host(out.data(), flat.data, flat.nbytes());
  } else {
    // The fp32 master weights, gathered from every rank's rows into one flat buffer.
    Buffer all = alloc_.allocate(out.size() * 4, MemCategory::comm);
    std::vector<Tensor> views;
    int64_t off = 0;
    for (const ParamSpec& p : spec.params) {
      views.push_back(
          Tensor(static_cast<float*>(all.data()) + off, p.shape, DType::f32, alloc_.device()));
      off += p.shape.numel();
    }
    gather_into(views);
    alloc_.backend().copy_to_host(out.data(), all.data(), out.size() * 4);
  }
  std::vector<float> local;
  if (spec.ep_size > 1) {  // the experts over ep, then the tp shards over tp
    local.swap(out);
    gather_ep_params(*ep_group_, spec, local, out);
  }
  if (mesh_.size(Axis::tp) > 1) {
    local.swap(out);
    gather_tp_params(mesh_.comm(Axis::tp), spec.without_ep(), local, out);
  }
}

std::vector<StateTensor> Zero::master_tensors() {
  // Stages 1-2 in fp32 hold the master weights whole (the same on every rank of the group after
  // the step's all-gather), stage 3 and 16-bit stages 1-2 only its rows.
  if (master_shards_) return opt_->master_tensors();
  std::vector<StateTensor> out;
  for (size_t i = 0; i < model_.params().size(); ++i)
    out.push_back({kMasterState, i, model_.params()[i]});
  return out;
}

void Zero::after_load() {
  if (zero_stage() < 3) {
    if (master_shards_) gather_into(model_.params());  // the loaded rows to every rank
    model_.sync_compute_weights();
  } else {
    for (size_t k = 0; k < units_.size(); ++k) release_gather(static_cast<int>(k));
    for (Unit& u : units_) u.secondary_valid = false;
  }
}

}  // namespace llmt
