// Placement: how a parameter with a global shape is laid out over one axis (axis.h: tp, cp, dp,
// pp, and ep) — replicated, sharded along one dim (tp's column and row splits; ep's experts, dim
// 0 of an expert stack), or owned whole by one coordinate of the axis (a pipeline stage's
// layers). Every shard is a list of rectangular slices of the
// global tensor, which is what checkpoints (one hyperslab per slice), initialisation (each slice
// from its global offset) and resharding rely on (docs/references.md, "Design rules").
//
// A sharded dim may be a concatenation of segments that are split separately: the fused QKV
// weight's rows are [q heads | k heads | v heads] and SwiGLU's fc1 rows are [gate | up]. Rank r
// of p holds rows [r*n/p, (r+1)*n/p) of every segment of length n, concatenated in segment order,
// so its local tensor has the same [q | k | v] (or [gate | up]) layout as the global one.
// Worked example: qkv.weight of H=4, KV=2, D=16 has rows [q 0..64 | k 64..96 | v 96..128); with
// tp=2, rank 1 holds q heads 2-3 (rows 32..64), kv head 1 (rows 80..96 and 112..128): three
// slices, local rows [0,32) [32,48) [48,64).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace llmt {

struct Placement {
  enum class Kind : uint8_t { replicate, shard, owned };
  Kind kind = Kind::replicate;
  int dim = 0;                    // shard only: the tensor dim that is split
  std::vector<int64_t> segments;  // shard only: the dim's parts, split separately; empty = one
  int owner = 0;                  // owned only: the coordinate on the axis that holds it

  static Placement replicate() { return {}; }
  static Placement shard(int dim, std::vector<int64_t> segments = {}) {
    return {Kind::shard, dim, std::move(segments), 0};
  }
  static Placement owned(int coord) { return {Kind::owned, 0, {}, coord}; }
  bool sharded() const { return kind == Kind::shard; }
  // "Replicate", "Shard(0)", "Shard(0, [64, 32, 32])", "Owned(1)"
  std::string str() const;
};

// One rectangular piece of a rank's shard: along `dim`, global [global_start, global_start +
// length) is local [local_start, local_start + length); every other dim is whole.
struct ShardSlice {
  int dim;
  int64_t global_start, local_start, length;
};

// Which ranks sum a parameter's gradient and share out its rows under ZeRO, as its placements
// make it (ModelSpec::grad_group): the data-parallel group (dp x cp), narrowed to the ranks of this
// rank's ep coordinate when the parameter is sharded over ep (expert stacks: only they hold the
// same experts), widened by tp when the parameter is replicated over tp but each tp rank's
// gradient is a part of the sum (routers and expert stacks: each tp rank routes its own tokens).
struct GradGroup {
  bool ep = false;  // narrowed to this rank's ep coordinate
  bool tp = false;  // widened by tp
  // The groups' fixed order (ZeRO lays out a unit's shards in it): dp x cp; its ep coordinate's
  // ranks; those times tp; dp x cp times tp.
  int index() const { return ep ? (tp ? 2 : 1) : (tp ? 3 : 0); }
  static GradGroup of_index(int k) { return {k == 1 || k == 2, k >= 2}; }
};
constexpr int kNumGradGroups = 4;

// The shape a rank holds of `global` under `p` over an axis of `axis_size` ranks (Owned: the
// owner's, the whole tensor). Throws (naming
// `what`, the dim and the numbers) when a segment does not divide by the axis size.
Shape local_shape(const Shape& global, const Placement& p, int axis_size, const std::string& what);
// The slices rank `axis_rank` holds, in local order (one whole-tensor slice for Replicate).
std::vector<ShardSlice> local_slices(const Shape& global, const Placement& p, int axis_size,
                                     int axis_rank);

}  // namespace llmt
