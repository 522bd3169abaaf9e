// Mesh: the world's ranks arranged on named axes tp, cp, dp, pp (tp fastest-varying, Megatron
// order), with one Communicator per axis group this rank belongs to, and on demand one per set of
// axes (Mesh::group). Worked example: with tp=2, dp=2, pp=2 (world 8), rank 5 = tp 1 + 2*(cp 0)
// + 2*(dp 0) + 4*(pp 1): it shares its tp group with rank 4, its dp group with rank 7, its pp
// group with rank 1, and its {tp, dp} group with ranks 4, 6 and 7.
#pragma once

#include <array>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/parallel/axis.h"
#include "engine/parallel/placement.h"

namespace llmt {

// Degrees and coordinates only: pure arithmetic, usable without MPI (`config show --world`).
struct MeshShape {
  std::array<int, kNumAxes> degree{1, 1, 1, 1};  // indexed by Axis
  int world() const { return degree[0] * degree[1] * degree[2] * degree[3]; }
  // A mesh axis's degree (tp, cp, dp, pp: ep is no axis of the rank arithmetic, and throws).
  int size(Axis a) const { return degree.at(static_cast<size_t>(a)); }
  // Coordinate of `rank` on each axis.
  std::array<int, kNumAxes> coords(int rank) const;
  int rank_of(const std::array<int, kNumAxes>& coords) const;
  // The global ranks of `rank`'s group along axis a, in axis order.
  std::vector<int> group(int rank, Axis a) const;
  // The global ranks of `rank`'s group over the axes `axes` (those that agree with it on every
  // other axis), in rank order: the group's rank of a member is its index here.
  std::vector<int> group(int rank, std::initializer_list<Axis> axes) const;
};

class Mesh {
 public:
  Mesh(MeshShape shape, int rank, std::array<std::unique_ptr<Communicator>, kNumAxes> axes,
       std::unique_ptr<Communicator> world);
  // Splits `world` (a collective over it) into one group per axis; world->size() must equal
  // shape.world().
  static Mesh create(MeshShape shape, std::unique_ptr<Communicator> world);
  const MeshShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  int coord(Axis a) const { return coords_.at(static_cast<size_t>(a)); }
  int size(Axis a) const { return shape_.size(a); }
  Communicator& comm(Axis a) const { return *axes_.at(static_cast<size_t>(a)); }
  Communicator& world() const { return *world_; }
  // The communicator of this rank's group over a set of axes (MeshShape::group): what gradient
  // sync and ZeRO reduce over (dp; dp x cp with context parallelism). Axes of degree 1 add no
  // ranks and are dropped; a set that leaves one axis is that axis's communicator. Any other
  // set is split from the world on its first use, which is a collective: every rank must ask
  // for it, in the same order as the others.
  Communicator& group(std::initializer_list<Axis> axes);
  // Expert parallelism over `ep` (dividing the dp x cp group): this rank's group of ep
  // consecutive ranks of its dp x cp group, which share out the experts ("ep"), and the ranks of
  // that group holding the same experts, whose group ranks are equal modulo ep ("edp": expert
  // gradients reduce over it). Split from group({dp, cp}) on the first call, a collective over it;
  // later calls must pass the same ep.
  Communicator& expert_group(int ep);
  Communicator& expert_data_group(int ep);
  // Under tensor parallelism with MoE layers (their experts replicated over tp, each tp rank
  // routing its own tokens): the ranks of the tp x dp x cp group holding the same experts, at
  // any tp coordinate ("edpxtp": their gradients reduce over it). The tp axis's size 1: the edp
  // group itself.
  Communicator& expert_data_tp_group(int ep);
  // The group a parameter of gradient group `g` (ModelSpec::grad_group) reduces over and ZeRO
  // cuts its rows over: group({dp, cp}); expert_data_group(ep); expert_data_tp_group(ep);
  // group({tp, cp, dp}). Made on first use, as those are (a collective).
  Communicator& grad_group(GradGroup g, int ep);
  // Hybrid sharding (parallel.zero_shard_group): grad_group(g, ep) cut into `replicas` equal
  // chunks of consecutive group ranks, which are runs of consecutive dp coordinates (dp is the
  // slowest axis of every gradient group, and the expert groups keep dp order): the chunk this
  // rank is in ("NAME_shard", where ZeRO shards), and the ranks at the same place of every chunk
  // ("NAME_replica", over which the shards' gradients are all-reduced). replicas must divide the
  // group's size; the shard group of 1 replica is the group itself (ask for replica groups only
  // with replicas > 1). Each is made on its first use (a collective over the group). hpZ's
  // secondary groups (zero.h) are shard groups too.
  // A second cut of the same group (hpZ's or qgZ's chunks beside hybrid sharding's) is named
  // with its group's size after the suffix ("dp_shard2"), so every counter has its own name.
  Communicator& zero_shard_group(GradGroup g, int ep, int replicas);
  Communicator& zero_replica_group(GradGroup g, int ep, int replicas);
  // qgZ's second hop: within zero_shard_group(g, ep, replicas), the ranks at the same place of
  // each of its chunks of the cut into `chunks` (chunks a multiple of replicas): the
  // replica group of `chunks` when replicas is 1, else split from the shard group ("NAME_cross").
  Communicator& zero_cross_group(GradGroup g, int ep, int replicas, int chunks);
  // Every communicator of this rank's: one per axis, then the groups made so far (counters).
  std::vector<Communicator*> communicators() const;

 private:
  MeshShape shape_;
  int rank_;
  std::array<int, kNumAxes> coords_;
  std::array<std::unique_ptr<Communicator>, kNumAxes> axes_;
  std::unique_ptr<Communicator> world_;
  std::map<unsigned, std::unique_ptr<Communicator>> groups_;  // by bit mask of the axes
  void make_expert_groups(int ep);
  int ep_ = 0;  // the ep the expert groups were made for
  struct HybridGroups {
    std::unique_ptr<Communicator> shard, replica;
  };
  Communicator& hybrid_group(GradGroup g, int ep, int replicas, bool replica);
  std::map<std::pair<int, int>, HybridGroups> hybrid_;  // by (GradGroup::index(), replicas)
  std::map<std::tuple<int, int, int>, std::unique_ptr<Communicator>> cross_;  // (g, R, chunks)
  std::unique_ptr<Communicator> ep_group_, edp_group_, edp_tp_group_;
};

}  // namespace llmt
