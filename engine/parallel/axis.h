// The mesh's named axes, fastest-varying first (Megatron order: tensor parallelism stays inside a
// node). Shared by the Mesh (groups per axis) and Placement (a parameter's layout per axis).
//
// The first kNumAxes (tp, cp, dp, pp) decompose the world's ranks. ep, expert parallelism, is a
// sub-axis of the dp x cp group (Megatron-Core's expert mesh over the same ranks): that group, dp
// outer, in runs of parallel.ep consecutive ranks that share out the experts (Mesh::expert_group).
// Parameters have a placement on it like on any axis (an expert stack: Shard(0)); the mesh's
// rank arithmetic (MeshShape) has no ep coordinate.
#pragma once

#include <cstdint>
#include <string_view>

namespace llmt {

enum class Axis : uint8_t { tp, cp, dp, pp, ep };
constexpr int kNumAxes = 4;           // the mesh's axes: tp, cp, dp, pp
constexpr int kNumPlacementAxes = 5;  // and ep: the axes a Placement is given for
std::string_view axis_name(Axis a);

}  // namespace llmt
