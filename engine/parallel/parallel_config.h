// [parallel] section: the mesh degrees and the data-parallel strategy. Lives with the parallel
// engine so it depends only on its own section; train parses it and checks it against
// the world size (validate_layout) before anything is allocated.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/parallel/context_parallel.h"  // CpImpl
#include "engine/schedule/schedule.h"          // PipeSchedule

namespace llmt {

class Rules;

struct ParallelConfig {
  int64_t tp = 1;                 // tensor parallel degree
  int64_t cp = 1;                 // context parallel degree (engine/parallel/context_parallel.h)
  CpImpl cp_impl = CpImpl::ring;  // how attention crosses the cp group: ring, ulysses, hybrid
  int64_t cp_ulysses = 0;         // hybrid: all-to-all over this many ranks, ring over cp/it
  // Latent attention under any cp implementation: each position's kv latent and RoPE key move
  // and every rank expands its heads' K/V from them (true), or the expanded K/V move (false).
  bool cp_latent = true;
  int64_t dp = -1;  // data parallel degree; -1 = world / (tp * cp * pp)
  // Expert parallel degree: a mixture of experts' experts split over groups of ep consecutive dp
  // ranks (docs/parallelism.md, "Expert parallelism"); divides dp.
  int64_t ep = 1;
  int64_t pp = 1;  // pipeline parallel degree (engine/pipeline/executor.h)
  PipeSchedule pp_schedule = PipeSchedule::one_f_one_b;
  int64_t virtual_stages = 1;  // model chunks per pp rank (interleaved only: >= 2)
  // Transformer layers per pipeline stage (pp * virtual_stages entries, summing to n_layers);
  // empty = split evenly. The first stage also holds the embeddings, the last the head and loss.
  std::vector<int64_t> pp_layers;
  // The zero-bubble schedules (zb-h1, zb-v, dualpipev): the most weight-gradient halves a pp rank
  // defers at once (each deferred one keeps its stash, under ep its MoE layers' row gradients);
  // past it ZB-H1 and ZB-V run the oldest right away, DualPipeV runs backwards whole. -1 = as
  // the schedule defers them; 0 = none (DualPipeV: every backward whole).
  int64_t pp_max_deferred = -1;
  int64_t zero_stage = 0;  // 0 DDP, 1 optimizer state, 2 + gradients, 3 + parameters
  // Hybrid sharding (HSDP, MiCS): ZeRO shards over groups of this many consecutive dp ranks (and
  // all cp ranks) and replicates across the dp/N groups, whose gradient shards are all-reduced
  // once a step; 0 = one group of every dp rank (plain ZeRO). Divides dp; zero_stage >= 1.
  int64_t zero_shard_group = 0;
  // ZeRO++'s qwZ (Wang et al. 2023): ZeRO-3 all-gathers the weights as int8 codes with an fp32
  // scale per block of zero_quant_block values (ops::quantize_int, 8 bits) instead of the compute
  // type.
  bool zero_quantized_weights = false;
  // ZeRO++'s qgZ: ZeRO-3 reduce-scatters the gradients as int4 codes with an fp32 scale per block
  // of zero_quant_block values (ops::quantize_int, 4 bits), by all-to-all: one hop over the shard
  // group, or two, within groups of zero_quantized_gradients_group consecutive dp ranks (x cp;
  // by default hpZ's, zero_hierarchical_partition), then across them (the paper's hierarchical
  // all-to-all); each hop sums the dequantised values in fp32.
  bool zero_quantized_gradients = false;
  // qgZ's first hop: groups of this many consecutive dp ranks (a node's, say); 0 = hpZ's groups
  // with hpZ on, else one hop. Divides dp (and the shard group); needs zero_quantized_gradients.
  int64_t zero_quantized_gradients_group = 0;
  int64_t zero_quant_block = 256;  // qwZ's and qgZ's block
  // ZeRO++'s hpZ: ZeRO-3 keeps a secondary copy of the weights (compute type) sharded within
  // groups of this many consecutive dp ranks (x cp), so that every gather of a unit after its
  // first since the update stays inside the group; 0 = off. Divides dp.
  int64_t zero_hierarchical_partition = 0;
  bool sequence_parallel = false;  // Megatron SP over the tp group
  double bucket_mb = 25.0;         // DDP/ZeRO gradient bucket size, MiB
};

// Hybrid sharding's replicas of the ZeRO state: dp / zero_shard_group, or 1 (plain ZeRO). ZeRO's
// shard group is then the dp x cp group's size / this (Mesh::zero_shard_group).
inline int64_t zero_replicas(const ParallelConfig& p, int64_t dp) {
  return p.zero_shard_group > 0 && dp % p.zero_shard_group == 0 ? dp / p.zero_shard_group : 1;
}

// hpZ's secondary group in ranks of the dp x cp group (zero_hierarchical_partition x cp), or 0
// without it.
inline int64_t zero_secondary_group(const ParallelConfig& p, int64_t cp) {
  return p.zero_stage == 3 && p.zero_hierarchical_partition > 0 ? p.zero_hierarchical_partition * cp
                                                                : 0;
}

// qgZ's first hop in ranks of the dp x cp group (zero_quantized_gradients_group, or hpZ's
// zero_hierarchical_partition, x cp), or 0: one hop over the shard group.
inline int64_t zero_qg_group(const ParallelConfig& p, int64_t cp) {
  if (p.zero_stage != 3 || !p.zero_quantized_gradients) return 0;
  return p.zero_quantized_gradients_group > 0 ? p.zero_quantized_gradients_group * cp
                                              : zero_secondary_group(p, cp);
}

// [parallel]'s own rules: degrees, schedules and their options, pp_layers against the model's
// n_layers (when n_layers >= 1), the zero stage, the bucket size.
void check_parallel_config(const ParallelConfig& p, int64_t n_layers, Rules& r);

}  // namespace llmt
