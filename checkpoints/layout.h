// Which pieces of the global tensors each rank of a layout writes, and where a rank's local rows
// sit in the global tensors: pure arithmetic on ModelSpec and MeshShape, shared by save, load,
// reshard and verify (docs/checkpoint-format.md).
//
// The write rule. For every parameter and every state the optimizer lists (the fp32 master
// weight "param", then e.g. AdamW's "exp_avg" and "exp_avg_sq"), take the tensor tp rank t holds
// (ModelSpec::shard_tp) and cut its R rows (ModelSpec::cut_rows: dim 0, an expert stack's
// experts x their first dim) as ZeRO does over its group, the ranks that share
// parameters and see different data (dp x cp, in rank order; MeshShape::group): the group's rank
// d of n writes rows [d*s, min(R, (d+1)*s)), s = ceil(R/n), whatever the zero stage (so DDP ranks
// share the writing and a ZeRO shard is written by its owner). A parameter replicated over tp is
// written by tp rank 0 only; under pipeline parallelism each pp rank writes the parameters of its
// stage, and the last stage's tied copy of wte (identical to stage 0's) is not written. Each piece
// is one or more boxes of the global tensor (a tp shard of the fused qkv weight is three row ranges
// of it), each a contiguous run of the local rows. Under expert parallelism an expert stack's
// group is the expert-data-parallel one instead: the dp ranks holding the same experts (dp
// coordinates equal modulo ep), of which the one with dp coordinate d is number d / ep. Under
// tp, a routed parameter of a mixture-of-experts layer (router, expert stacks: replicated over tp
// but each tp rank's gradient is a part of their sum) is cut over that group times tp instead,
// every tp rank writing its rows (ModelSpec::row_group).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/model_spec.h"
#include "engine/model/parallelize.h"
#include "engine/optim/sharded_optimizer.h"
#include "engine/parallel/mesh.h"

namespace llmt::ckpt {

// The group of a state in the index and shard files: "model" for kMasterState ("param"),
// "optimizer/NAME" for an optimizer state ("optimizer/exp_avg").
std::string state_group(const std::string& state);
// "model/layers.3.mlp.fc1.weight", "optimizer/exp_avg/wte.weight".
std::string tensor_path(const std::string& state, const std::string& param_name);
// The state and parameter of a tensor path (the inverse of tensor_path); throws Error on a path
// of no state group.
std::pair<std::string, std::string> split_tensor_path(const std::string& path);

// A rectangular block of a global tensor of ndim dims, row-major.
struct Box {
  std::vector<int64_t> start, count;
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  std::string str() const;  // "[0:64, 16:32]"
};
Box whole(const Shape& shape);
// The common part of a and b (empty when they do not meet).
Box intersect(const Box& a, const Box& b);

// A global box that is the contiguous elements [local_offset, local_offset + box.numel()) of a
// run of local rows (offsets counted from the run's first row).
struct LocalBox {
  Box global;
  int64_t local_offset = 0;
};
// The global boxes of parameter i that rows [row_begin, row_end) of the tensor `tp_spec` holds
// (its tp shard) are, in local order. Rows are ModelSpec::cut_rows: dim 0, or an expert stack's
// (expert, first dim) pairs.
std::vector<LocalBox> global_boxes(const ModelSpec& tp_spec, size_t i, int64_t row_begin,
                                   int64_t row_end);

// One run of local rows of one state tensor that a rank writes.
struct Piece {
  std::string state;
  size_t param;
  int64_t row_begin, row_end;  // rows of the tp-local tensor
};
// What global rank `rank` of `mesh` writes of each of `states` (the rule above); tp_spec =
// spec.shard_tp for that rank's tp coordinate. Order: spec order, then states.
// Under hybrid sharding (`zero_shard_group` N > 0 dp ranks) the group is cut into dp/N chunks of
// consecutive dp coordinates, as ZeRO shards (Mesh::zero_shard_group): the first chunk's ranks
// write, cutting rows over the chunk; the other chunks hold replicas of the same rows.
std::vector<Piece> pieces_to_write(const ModelSpec& tp_spec, const MeshShape& mesh, int rank,
                                   const std::vector<std::string>& states,
                                   int64_t zero_shard_group = 0);

// The name of box k of a piece inside a rank file: "model/wte.weight/0".
std::string shard_dataset(const std::string& state, const std::string& param_name, size_t box);
// "rank_00003.h5".
std::string rank_file_name(int rank);

}  // namespace llmt::ckpt

namespace llmt::ckpt {

// Where one box of a global tensor is stored: dataset `dataset` of rank file `file`.
struct Mapping {
  Box dest;
  std::string file, dataset;
};
// One global tensor of the index ("model/wte.weight") and the boxes that make it up.
struct IndexTensor {
  std::string path;
  std::vector<int64_t> shape;
  std::vector<Mapping> mappings;
};
// The layout a checkpoint is written in: the mesh, the pipeline split (parallel.virtual_stages
// and parallel.pp_layers, which decide the layers of each pp rank) and the ep degree. What each
// rank of it holds is parallelize(spec, layout, rank) (engine/model/parallelize.h).
using WriteLayout = ModelLayout;

// Every global tensor of `spec` (whole model, global shapes) for each of `states` and, for each,
// where every rank of `layout` writes its pieces (the write rule above). Order: states, then spec
// order.
std::vector<IndexTensor> plan_index(const ModelSpec& spec, const WriteLayout& layout,
                                    const std::vector<std::string>& states);

}  // namespace llmt::ckpt
