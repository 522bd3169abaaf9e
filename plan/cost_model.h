// The cost model behind `llmtrain plan`: from a config, a world size and a hardware profile,
// what one step of each pipeline stage computes, moves on each mesh axis and holds in memory,
// and the step time and MFU that follow. Nothing is allocated and MPI is not started. The bytes
// per axis are the communicator's counters of a real run (tests/mpi/plan_comm.py checks them);
// the memory is the exact training state of rank_state_bytes, the activations as each pipeline
// rank's model lays them out (that model built on the meta device: make_rank_model), and
// estimates of the communication buffers; the time is a model with the assumptions listed in
// docs/papers.md ("The cost model").
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "engine/parallel/axis.h"
#include "plan/hardware.h"
#include "train/config.h"
#include "train/memory_estimate.h"

namespace llmt {

// Bytes one rank moves on one mesh axis in a step, by collective, as Communicator counts them
// (communicator.h): all-reduce 2(g-1)/g x the buffer, reduce-scatter and all-gather (g-1)/g x
// the whole buffer, send and recv the message, all-to-all (g-1)/g x the buffer. Control
// messages (the gradient norm, the non-finite flag: a few floats a step) are left out.
struct AxisBytes {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0, send = 0, recv = 0, all_to_all = 0;
  double total() const {
    return all_reduce + reduce_scatter + all_gather + send + recv + all_to_all;
  }
};

// One pipeline rank (tp, cp and dp coordinate 0; the others of its stage do the same).
struct StageCost {
  int rank = 0, pp_rank = 0;
  int64_t layers = 0;
  bool embedding = false, head = false;
  double flops = 0;  // FLOPs this rank runs in a step, recompute included
  // Of which beyond the model's FLOPs: the recompute's, and the latent cp core's expansions of
  // other ranks' blocks (hardware FLOPs).
  double recompute_flops = 0;
  std::array<AxisBytes, kNumAxes> bytes{};  // by Axis
  // Training state exactly (rank_state_bytes), activations and comm buffers estimated.
  MemoryEstimate memory;
  // The concurrent peak (what `fits` is judged by): the state, the model's scratch and the
  // buffers held all step, and the largest sum of activations and ZeRO's buffers live at one
  // moment of a replay of the step's allocations in order (forward and backward of each
  // micro-batch, or the pipeline schedule's actions, through Zero's hooks). memory.total(), the
  // sum of each category's peak, is at least this.
  double peak = 0;
  int in_flight = 1;  // micro-batches (interleaved: (micro-batch, chunk) pairs) held at the peak
  // Seconds of a step: compute, the exposed communication of each axis (tp and the pp sends on
  // the critical path; cp ring transfers hidden behind attention; dp/ZeRO behind backward as far
  // as it goes), the optimizer (memory bound).
  double compute_s = 0, optimizer_s = 0;
  // The ops other than matmuls and attention: the bytes they move in the step (RankActivations)
  // at the device's memory bandwidth, on the pipeline's path like the compute.
  double other_ops_bytes = 0, other_ops_s = 0;
  // The rounding passes of 16-bit values stored in fp32 tensors (the activation gradients):
  // the runtime runs them, a native 16-bit kernel does them as it stores; not charged.
  double rounding_bytes = 0;
  std::map<std::string, double> other_ops_by_op;  // other_ops_bytes by op name
  std::array<double, kNumAxes> comm_s{};
  double ep_s = 0;        // expert parallelism's all-to-alls, all exposed (bytes: dp's all_to_all)
  double pipeline_s = 0;  // m micro-batches of (compute + other ops + tp + cp + pp + ep) x (1 +
                          // bubble)
  // [offload] "nvme": the bytes a step reads from and writes to the files (the optimizer's state
  // and offloaded masters once each way; ZeRO-3's offloaded shards at every gather from them and
  // once each way in the update), and their time at the profile's nvme_bandwidth (0 where it is
  // unknown), not hidden behind compute.
  double offload_io_bytes = 0, offload_s = 0;
  double step_s = 0;  // pipeline_s + exposed dp + optimizer + offload
};

struct StepCost {
  int world = 1;
  int micro_batches = 1;      // per dp rank per step
  double model_flops = 0;     // per step, all ranks: 6N + 6LCT per token (no recompute)
  double hardware_flops = 0;  // model_flops + the recompute's
  double bubble = 0;          // the schedule's bubble formula (idle / busy)
  double step_s = 0;          // the slowest stage's
  double tokens_per_s = 0;
  double mfu = 0, hfu = 0;        // model / hardware FLOPs per second over world x peak
  double peak = 0;                // FLOP/s of one device at the config's precision
  std::vector<StageCost> stages;  // one per pp rank
  int slowest = 0;                // index into stages
  int most_memory = 0;            // index into stages: the highest concurrent peak
  bool fits = true;               // every stage's concurrent peak within the device's
};

// The axis a group of consecutive-in-mesh-order ranks lives on decides its bandwidth: a group
// whose ranks lie within one node uses intra_node_bandwidth, else inter_node_bandwidth.
// Throws ConfigError for a layout that validate_layout refuses.
// One pipeline rank's activation memory, counted on its model built on the meta device.
struct RankActivations {
  double per_mb = 0;  // one micro-batch's saved set, the average of the rank's chunks
  // Per model chunk of the rank: one micro-batch's saved set (chunk 0 with the embeddings, the
  // last with the head; under ep with its layers' received rows) and zero-bubble stash.
  std::vector<double> chunk_mb, chunk_stash;
  double scratch = 0;  // shared by every micro-batch
  // Under ep: one MoE layer's received rows for one micro-batch (MoeMlp::EpRows), held from the
  // layer's forward to its weight backward, and per chunk those of its MoE layers that keep
  // them (not fully recomputed; included in chunk_mb).
  double ep_rows = 0;
  double ep_rows_no_act = 0;  // those of a layer recomputing its routed activation ("moe_act")
  std::vector<double> chunk_ep_rows;
  // Under ep: what one MoE layer's backward adds for a moment (ep_backward_specs, and without a
  // zero-bubble schedule the rows' gradients), included in scratch; with fully recomputed MoE
  // layers (back to back) also their rows, dispatched again in backward (ep_full_rows).
  double ep_transient = 0, ep_full_rows = 0;
  // Per chunk, in a schedule that splits some backwards and runs the others whole (DualPipeV):
  // what a whole backward adds for a moment under ep (one MoE layer's row gradients, and a fully
  // recomputed layer's rows), not in scratch; the split ones stash theirs (chunk_stash).
  std::vector<double> chunk_whole;
  // The bytes the rank's ops move in one micro-batch's forward and backward of all its chunks
  // (recompute included), counted by running them on the meta device (ops::Recording): the
  // matmuls' and attention's, and every other op's (norms, activations, rotary, residual adds,
  // the loss, MoE's routing and permutations, conversions).
  double matmul_bytes_mb = 0, other_bytes_mb = 0;
  double rounding_bytes_mb = 0;               // round_to's passes (ops::OpTally): not charged
  std::map<std::string, double> other_by_op;  // other_bytes_mb by op name
};
// The RankActivations of the layouts costed so far, for one model config (a search costs
// thousands of layouts that differ only in dp, ZeRO stage or schedule, which the model's
// layout does not depend on).
struct ActivationCache {
  std::map<std::string, RankActivations> by_layout;
};
// count_ops false: the other ops' bytes are not counted (their time is 0): for what needs only
// the memory (stage_memory), so a run's memory check never runs a model step.
StepCost predict_step(const Config& cfg, int world, const HardwareProfile& hw,
                      ActivationCache* cache = nullptr, bool count_ops = true);

// Each pipeline rank's memory as predict_step reports it (the state exactly, activations and comm
// buffers estimated), indexed by pp coordinate; it does not depend on the hardware. Builds the
// model's spec: call it once a lower bound (estimate_rank_memory) has shown the model fits.
std::vector<MemoryEstimate> stage_memory(const Config& cfg, int world);

// The fraction of a device's memory a plan may fill (the rest: the CUDA context, allocator
// fragmentation, library workspaces).
constexpr double kUsableMemoryFraction = 0.9;

}  // namespace llmt
