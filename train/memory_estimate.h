// Memory before allocation (docs/slurm.md, "Memory"): a lower bound of the bytes one rank of a
// layout allocates, from the config alone (no spec of n_layers layers is built), and the host
// memory this process may still take. The app refuses a run whose ranks on one node need more
// than the node has (exit 2, every number named) unless --force.
#pragma once

#include <string>

#include "engine/model/model_spec.h"
#include "engine/parallel/mesh.h"
#include "train/config.h"

namespace llmt {

// Bytes of one rank, by category (MemCategory): P = the model's parameters, tp*pp ranks share
// them (the average share: the largest rank holds at least this); params 4P (+ 2P for the 16-bit
// compute copy; / dp under ZeRO-3), grads 4P (/ dp from ZeRO-2), optimizer 8P (/ dp from ZeRO-1),
// activations at least one micro-batch's layer inputs (4 s b h per layer of the rank; / tp with
// sequence parallelism): what full recompute keeps, the least any mode keeps.
// `offloaded`: the bytes [offload] "nvme" keeps in files instead (in no other field, nor in total).
struct MemoryEstimate {
  double params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0;
  double offloaded = 0;
  double total() const { return params + grads + optimizer + activations + comm; }
};
MemoryEstimate estimate_rank_memory(const Config& c, const MeshShape& mesh);

// The training state one rank allocates, exactly (activations left 0): `rank_spec` is what the
// rank holds (its pipeline stage's parameters, its tp shard), ZeRO shards cut as zero.h does over
// the group of `group` ranks (dp x cp) of which it is `group_rank` (expert stacks under ep and
// routed parameters under tp over their own groups: ModelSpec::row_group). params 4P (+ 2P for
// the 16-bit compute copy under DDP; in 16-bit at ZeRO-1/2 the compute copy 2P + the fp32 master
// shards) or, at ZeRO-3, its padded shards; grads g P (g = grad_bytes: 4, or 2 with
// train.grad_dtype = "compute"), or its padded shards from ZeRO-2; optimizer 8 x what it owns
// (all of P under DDP, its rows from ZeRO-1). `secondary_group` > 0 (ZeRO-3 with hpZ): params
// also hold the secondary copy, padded shards over a group of that many ranks (place 0), in the
// compute type. `offload_optimizer`, `offload_params` ([offload] "nvme"): what goes to the files
// moves from params and optimizer to offloaded.
MemoryEstimate rank_state_bytes(const ModelSpec& rank_spec, int64_t zero_stage, int group,
                                int group_rank, bool sixteen_bit,
                                OptimizerType optimizer = OptimizerType::adamw, int grad_bytes = 4,
                                int secondary_group = 0, bool offload_optimizer = false,
                                bool offload_params = false);

// What this process may still allocate on the host: the smallest of /proc/meminfo's MemAvailable,
// the cgroup's limit minus its usage (v2 memory.max / memory.current, v1 memory.limit_in_bytes /
// memory.usage_in_bytes) and `ulimit -v` minus the address space mapped already; or
// LLMTRAIN_MEMORY_AVAILABLE (bytes) when set, alone (throws ConfigError when it is not a number).
// `source` names the one that decided.
struct AvailableMemory {
  double bytes = 0;
  std::string source;
};
AvailableMemory host_memory_available();

// "1.234 GiB" (MiB below 1 GiB, TiB from 1 TiB on).
std::string gib(double bytes);

}  // namespace llmt
