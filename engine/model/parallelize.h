// parallelize: the one place a rank's model is composed from the global ModelSpec and a parallel
// layout. The trainer (its own rank), the checkpoint write rule and readers (every rank of the
// layout a checkpoint was written in) and `plan` (each rank it costs) all call it, so they cannot
// disagree about what a rank holds (DESIGN.md, "Data flow of a run", step 3).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/model_spec.h"
#include "engine/parallel/mesh.h"
#include "engine/parallel/parallel_config.h"

namespace llmt {

// What decides a rank's share of the model: the mesh degrees, the pipeline split and the expert
// parallel degree. (The checkpoint format calls it the write layout: checkpoints/layout.h.)
struct ModelLayout {
  MeshShape mesh;
  int virtual_stages = 1;          // model chunks per pp rank (parallel.virtual_stages)
  std::vector<int64_t> pp_layers;  // layers per pipeline stage (parallel.pp_layers); empty: even
  int ep = 1;                      // expert parallel degree (parallel.ep)
  // ZeRO's shard group in dp ranks (parallel.zero_shard_group; 0: all of dp): holds nothing of
  // the model, but decides which ranks write a checkpoint's rows (checkpoints/layout.h).
  int64_t zero_shard_group = 0;
  // The V-shaped stage order of parallel.pp_schedule = "zb-v" or "dualpipev" (schedule.h: chunk 1
  // of pp rank r is stage 2*pp-1-r), else Megatron's looped order.
  bool v_shape = false;
};

// The layout of [parallel] `p` on a mesh of those degrees.
ModelLayout model_layout(const ParallelConfig& p, const MeshShape& mesh);

// Global rank `rank`'s expert-parallel rank: its place in its dp x cp group (dp outer, the order
// MeshShape::group lists it and Mesh::expert_group splits it) mod ep.
int expert_rank(const MeshShape& mesh, int ep, int rank);

// What global rank `rank` of `layout` holds of the whole-model `spec`, transform by transform:
// its pipeline stage (ModelSpec::shard_pp, when pp > 1), its tp shard (shard_tp), its experts
// (shard_ep, ep rank = expert_rank). Names and global shapes stay; shapes and placements change.
ModelSpec parallelize(const ModelSpec& spec, const ModelLayout& layout, int rank);

}  // namespace llmt
