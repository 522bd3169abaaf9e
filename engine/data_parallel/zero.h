// ZeRO stages 1-3 over the data-parallel group (DataParallel: dp, or dp x cp) with per-parameter
// Shard(0) (the FSDP2 layout): parameter i
// with R rows (ModelSpec::cut_rows: dim 0; an expert stack [E, A, ...] E·A rows of (expert, A), so
// that a group larger than E still shares it out, a shard then up to three boxes of the global
// tensor) is cut into dp shards of s = ceil(R/dp) rows, rank r owning global rows
// [r*s, min(R, (r+1)*s)) — a rectangular slice of the global tensor; the last ranks' shards are
// padded with zero rows (kept zero: their gradient is zero, so AdamW leaves them at zero).
// Collectives batch a unit's shards through one staging buffer laid out rank-major
// ([rank 0's shards of the unit's params | rank 1's | ...]), packed and unpacked with copies.
//
// Units: unit 0 is the root (block 0, embeddings, and block L+1, final norm + head: with tied
// embeddings both use wte, so they are gathered and reduced together, as FSDP2's root module),
// unit l (1..L) is layer l.
//   stage 1: full params and grads (model-owned); after the last micro-batch's backward, each
//            unit's gradients are reduce-scattered and this rank's rows written back; AdamW
//            (m, v for the shard only) updates this rank's rows; each unit is all-gathered.
//   stage 2: as 1, but the model owns no gradient buffer: each unit's gradients go to a staging
//            buffer bound just before its backward and are reduce-scattered into the fp32
//            gradient shard right after it, every micro-batch.
//   stage 3: as 2, and the parameters are shards too: a unit is all-gathered into a staging
//            buffer just before its forward and again before its backward (the next unit's
//            gather started one block early), and freed after use.
// In 16-bit precision stages 1-2 shard the fp32 master weights too: the model's full weights are
// the compute copy (ModelStorage::master false, values rounded to 16 bits), the optimizer updates
// the master rows in a shard buffer, and the step's all-gather sends those rows into the model's
// weights, which are then rounded in place (the ZeRO paper's layout: 16-bit weights whole, fp32
// master rows in the optimizer's partition). The values each rank computes with are the same as
// with whole masters.
// Staging buffers (gathered units, gradient staging, packed collectives) count under
// MemCategory::comm; params/grads/optimizer hold exactly the (padded) shards.
//
// Parts: a parameter's rows are sharded over its gradient group (ModelSpec::grad_group, from its
// placements), so a unit is one part per group its parameters use, each with its own shards,
// packing and collectives (the gathered layout stays one, spec order). Under expert parallelism
// (ep > 1) the model holds this rank's E/ep experts of each expert stack (Shard(0) over ep), whose
// rows are sharded over the ranks holding the same experts (group/ep ranks); the rest over the
// whole group. Under tp the router and the expert stacks are replicated over tp, but each tp rank
// routes its own rows of the sequence, so their gradients are parts of a sum over tp: their group
// is widened by tp, its reduce-scatter sums the tp ranks' parts as DDP's all-reduce does, and
// their rows count in the grad norm on every tp rank. Every global row is still owned by exactly
// one rank of its group; ModelSpec::row_group sizes the groups, and the checkpoint write rule
// cuts rows the same way.
//
// Hybrid sharding (parallel.zero_shard_group = N, HSDP / MiCS): every part's group is cut into
// dp/N chunks of consecutive dp coordinates (Mesh::zero_shard_group); all of the above happens
// inside the chunk, so each chunk holds a whole replica of the sharded state. After the step's
// last reduce-scatter of a unit, its gradient shard is all-reduced across the chunks
// (Mesh::zero_replica_group: the ranks owning the same rows), once a step, so every replica
// updates its rows with the gradient of the global batch.
//
// Quantised weights (parallel.zero_quantized_weights, ZeRO++'s qwZ): stage 3 all-gathers each
// part's shard as int8 codes with an fp32 scale per block of zero_quant_block values
// (ops::quantize_int in 8 bits of the fp32 master rows, about 1 byte a weight) and dequantises what
// it gathered into the compute type; forward and backward gather the same codes, so both use the
// same weights. The master weights, gradients and optimizer stay exact.
//
// Quantised gradients (parallel.zero_quantized_gradients, ZeRO++'s qgZ): stage 3 reduce-scatters
// each part's gradients as int4 codes with an fp32 scale per block of zero_quant_block values
// (ops::quantize_int in 4 bits, each rank's block quantised apart), by all-to-all. One hop: every
// rank of the group sends each other rank its block's codes, and each sums the n dequantised
// blocks it receives in fp32, in rank order. Two hops (with hpZ, whose groups of N ranks are the
// first hop's; the paper's hierarchical all-to-all): a rank of chunk c at place l of the group
// (rank c N + l) packs the blocks by their owner's place first ([l'][c']), so that an all-to-all
// within the chunk brings it the chunk's blocks of every rank at place l; it sums those, quantises
// the sums again and all-to-alls them across the chunks among the ranks at place l
// (Mesh::zero_cross_group), whose sum is its own rows'. The second hop starts when the next unit's
// reduction does; the sum lands where the reduce-scatter's would.
//
// Hierarchical partitioning (parallel.zero_hierarchical_partition = N, ZeRO++'s hpZ): stage 3
// keeps a secondary copy of the weights in the compute type, each unit's part cut over chunks
// of N consecutive dp ranks (x cp; Mesh::zero_shard_group, as hybrid sharding cuts), filled from
// the unit's first gather after each update; every later gather of the unit until the next
// update (its backward, and the other micro-batches' forward and backward) all-gathers the
// secondary rows within the chunk instead of the primary shards over the whole group.
#pragma once

#include <array>
#include <deque>
#include <optional>

#include "engine/data_parallel/data_parallel.h"
#include "engine/data_parallel/zero_layout.h"
#include "engine/data_parallel/zero_sequence.h"

namespace llmt {

// The hooks run ZeroSequence's order (zero_sequence.h) over this class's primitives.
class Zero final : public DataParallel, private ZeroSequence {
 public:
  // `seed`: stage 3 initialises its shards from (seed, global name, global element index), as
  // Transformer::init does for whole tensors.
  Zero(const ParallelConfig& cfg, const OptimizerConfig& opt, Mesh& mesh, Communicator& group,
       Transformer& model, Allocator& alloc, uint64_t seed);

  void start_step() override;
  double take_wait_seconds() override;
  void start_micro_batch(bool last) override;
  void before_forward(int block) override;
  void before_backward(int block) override;
  void after_backward(int block) override;
  void finish_backward() override;
  double grad_norm() override;
  bool grads_nonfinite() override;
  void step(double lr, int64_t t, float grad_scale) override;
  void gather_params(std::vector<float>& out) override;
  void after_load() override;

 private:
  std::vector<StateTensor> master_tensors() override;
  // Muon: the row group's padded shards all-gathered (gather_staging_), the real rows kept.
  void gather_rows(size_t i, Tensor rows, Tensor local) override;
  void take_local_rows(size_t i, Tensor local, Tensor rows) override;
  // The parts and each parameter's rows: zero_layout.h (what plan counts too).
  static constexpr int kParts = kZeroParts;
  using Param = ZeroParam;
  struct Part {
    int64_t shard_numel = 0;  // this rank's (padded) shards of the part's params (ZeroUnit's)
    int64_t shard_begin = 0;  // offset in the shard buffers
    // Stage 3: the in-flight all-gather of the part's shards into `staging` (in 16-bit
    // precision from `send`, the shards rounded to the compute type). Quantised (qwZ): `send`
    // holds this rank's shard as int8 blocks (ops::quantize_int), gathered into `packed`, which
    // finish_gather dequantises into `staging`.
    Buffer staging, send, packed;
    Handle gather;
    bool from_secondary = false;  // hpZ: the gather in flight is of the secondary rows
  };
  struct Unit {
    std::vector<Param> params;
    std::vector<int> blocks;         // in spec order
    std::vector<int64_t> block_off;  // each block's offset in the gathered layout
    int64_t full_numel = 0;
    std::array<Part, kParts> parts;
    Buffer gathered;      // stage 3: the gathered weights (spec order)
    Buffer grad_staging;  // stages 2-3: this micro-batch's gradients, spec order
    // hpZ: the unit cut over the secondary groups (zero_layout.h), where each part's secondary
    // rows sit in secondary_, and whether they hold the current weights.
    ZeroUnit secondary;
    std::array<int64_t, kParts> secondary_begin{};
    bool secondary_valid = false;
  };
  // How a unit's part is cut over a group: its parameters' rows, this rank's (padded) shard
  // elements, the group's size and this rank's place (the primary shards, or hpZ's secondary).
  struct Cut {
    const std::vector<Param>* params;
    int64_t numel;
    int n, me;
  };
  Cut primary_cut(const Unit& u, int part) const;
  Cut secondary_cut(const Unit& u, int part) const;
  struct Reduction {
    int unit, part;
    Handle handle;
    Buffer packed, out;
    // qgZ: the all-to-all in flight (1: the first hop, 2: the second; 0: a reduce-scatter) and
    // its int4 blocks sent and received.
    int hop = 0;
    Buffer send, recv;
  };

  const Param& param_of(size_t i) const;
  static Tensor as_rows(Tensor t, const Param& p);
  Tensor shard_rows(Tensor shard_buf, const Unit& u, const Param& p, int64_t rows) const;
  // dst (rank-major, n x numel of the cut) <- rows of each of the part's params' views
  // (spec-order `views`); only this rank's block unless `all_ranks`. `chunk` > 0 (qgZ's two
  // hops): rank r's block at place (r % chunk) * (n / chunk) + r / chunk instead.
  void pack(Tensor dst, const Cut& c, int part, const std::vector<Tensor>& views, bool all_ranks,
            int chunk = 0);
  // views <- src (rank-major).
  void unpack(const std::vector<Tensor>& views, Tensor src, const Cut& c, int part);
  std::vector<Tensor> unit_views(const Unit& u, Tensor gathered) const;
  // ZeroSequence's primitives.
  void start_gather(int unit) override;
  void finish_gather(int unit) override;
  void release_gather(int unit) override;
  bool holds(int unit) const override;
  bool staged(int unit) const override;
  void stage_gradients(int unit) override;
  void start_reduce(int unit) override;
  void complete_reductions(size_t keep) override;
  void poll() override;
  // qgZ: a reduction's gradient blocks quantised and its first all-to-all started; its second
  // started (once the first is done); the received blocks summed into `out`.
  void start_quantized(Reduction& red, Tensor packed);
  void advance(Reduction& red);
  void finish_quantized(Reduction& red);
  void init_shards(uint64_t seed);
  // [offload] "nvme" (param_shard_ in the allocator's FileStore): a unit's shards read ahead, or
  // written back and dropped from memory after use; nothing otherwise (or past the last unit).
  void stream_shards(size_t unit, bool ahead);
  void gather_into(const std::vector<Tensor>& dst);

  // The parts' groups are grad_groups_ (part k: GradGroup::index() k): their sizes, and this
  // rank's place in them (an unused part: 1, 0).
  std::array<int, kParts> n_, rank_;
  // Hybrid sharding: each part's replica group (nullptr: one replica, or an unused part), and
  // the all-reduces of the last micro-batch's gradient shards in flight (stages 2-3).
  std::array<Communicator*, kParts> replica_{};
  std::vector<Handle> replica_reduces_;
  int64_t quant_block_ = 0;  // qwZ's block (parallel.zero_quant_block), 0: not quantised
  // qgZ's block (0: the gradients are reduce-scattered), and each part's first-hop and second-hop
  // groups (qg2_ nullptr: one hop).
  int64_t grad_quant_block_ = 0;
  std::array<Communicator*, kParts> qg1_{}, qg2_{};
  // hpZ: each part's secondary group (nullptr: hpZ off, or an unused part), its size and this
  // rank's place, and every unit's secondary rows (compute type, counted as params).
  std::array<Communicator*, kParts> secondary_group_{};
  std::array<int, kParts> n2_{}, rank2_{};
  Buffer secondary_;
  void fill_secondary(Unit& u, const std::vector<Tensor>& views);
  std::vector<Unit> units_;
  Buffer param_shard_, grad_shard_;  // master_shards_ / stages 2-3: (sum of unit shard_numel)
  bool master_shards_ = false;       // the fp32 master weights are param_shard_'s rows
  std::deque<Reduction> reductions_;
  std::vector<std::pair<size_t, size_t>> param_at_;  // by model param: (unit, index in it)
  Buffer gather_send_, gather_staging_;              // Muon: one shard, and the group's
};

}  // namespace llmt
