// MeshShape arithmetic (rank <-> coordinates, tp fastest) and the Mesh's per-axis groups, split
// from the world communicator: the ranks that agree on every coordinate but `a` form a group of
// axis a, ordered by their coordinate on a.
#include "engine/parallel/mesh.h"

#include <algorithm>

#include "core/check.h"

namespace llmt {

std::string_view axis_name(Axis a) {
  switch (a) {
    case Axis::tp:
      return "tp";
    case Axis::cp:
      return "cp";
    case Axis::dp:
      return "dp";
    case Axis::pp:
      return "pp";
    case Axis::ep:
      return "ep";
  }
  return "?";
}

std::array<int, kNumAxes> MeshShape::coords(int rank) const {
  LLMT_CHECK(rank >= 0 && rank < world(), "rank ", rank, " outside a mesh of ", world());
  std::array<int, kNumAxes> c{};
  for (int a = 0; a < kNumAxes; ++a) {
    c[a] = rank % degree[a];
    rank /= degree[a];
  }
  return c;
}

int MeshShape::rank_of(const std::array<int, kNumAxes>& c) const {
  int rank = 0;
  for (int a = kNumAxes - 1; a >= 0; --a) {
    LLMT_CHECK(c[a] >= 0 && c[a] < degree[a], axis_name(static_cast<Axis>(a)), " coordinate ", c[a],
               " outside degree ", degree[a]);
    rank = rank * degree[a] + c[a];
  }
  return rank;
}

std::vector<int> MeshShape::group(int rank, Axis a) const {
  std::array<int, kNumAxes> c = coords(rank);
  std::vector<int> ranks;
  for (int i = 0; i < size(a); ++i) {
    c[static_cast<int>(a)] = i;
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

std::vector<int> MeshShape::group(int rank, std::initializer_list<Axis> axes) const {
  const std::array<int, kNumAxes> c = coords(rank);
  std::vector<int> ranks;
  for (int r = 0; r < world(); ++r) {
    const std::array<int, kNumAxes> o = coords(r);
    bool same = true;
    for (int a = 0; a < kNumAxes; ++a) {
      bool in_set = false;
      for (Axis x : axes) in_set = in_set || static_cast<int>(x) == a;
      same = same && (in_set || o[a] == c[a]);
    }
    if (same) ranks.push_back(r);
  }
  return ranks;
}

Mesh::Mesh(MeshShape shape, int rank, std::array<std::unique_ptr<Communicator>, kNumAxes> axes,
           std::unique_ptr<Communicator> world)
    : shape_(shape),
      rank_(rank),
      coords_(shape.coords(rank)),
      axes_(std::move(axes)),
      world_(std::move(world)) {
  for (int a = 0; a < kNumAxes; ++a) {
    LLMT_CHECK(axes_[a] && axes_[a]->size() == shape_.degree[a] && axes_[a]->rank() == coords_[a],
               "mesh axis ", axis_name(static_cast<Axis>(a)),
               ": communicator does not match "
               "degree ",
               shape_.degree[a], " / coordinate ", coords_[a]);
  }
}

Mesh Mesh::create(MeshShape shape, std::unique_ptr<Communicator> world) {
  LLMT_CHECK(world->size() == shape.world(), "mesh tp(", shape.degree[0], ")*cp(", shape.degree[1],
             ")*dp(", shape.degree[2], ")*pp(", shape.degree[3], ")=", shape.world(),
             " != world size ", world->size());
  const int rank = world->rank();
  std::array<std::unique_ptr<Communicator>, kNumAxes> axes;
  for (int a = 0; a < kNumAxes; ++a) {
    const Axis axis = static_cast<Axis>(a);
    // Color: the group's lowest rank (coordinate on `a` set to 0); key: the coordinate on `a`.
    const int color = shape.group(rank, axis).front();
    axes[a] = world->split(color, shape.coords(rank)[a], std::string(axis_name(axis)));
  }
  return Mesh(shape, rank, std::move(axes), std::move(world));
}

std::vector<Communicator*> Mesh::communicators() const {
  std::vector<Communicator*> out;
  for (const auto& c : axes_) out.push_back(c.get());
  for (const auto& [mask, c] : groups_) out.push_back(c.get());
  if (ep_group_) out.push_back(ep_group_.get());
  if (edp_group_) out.push_back(edp_group_.get());
  if (edp_tp_group_) out.push_back(edp_tp_group_.get());
  for (const auto& [key, h] : hybrid_)
    for (const auto* c : {&h.shard, &h.replica})
      if (*c) out.push_back(c->get());
  for (const auto& [key, c] : cross_) out.push_back(c.get());
  return out;
}

void Mesh::make_expert_groups(int ep) {
  if (ep_ == ep) return;
  LLMT_CHECK(ep_ == 0, "expert groups made for ep=", ep_, ", asked for ep=", ep);
  Communicator& g = group({Axis::dp, Axis::cp});
  LLMT_CHECK(ep >= 1 && g.size() % ep == 0, "parallel.ep=", ep, " does not divide the dp x cp ",
             "group of ", g.size(), " ranks");
  const int d = g.rank();
  ep_group_ = g.split(d / ep, d % ep, "ep");
  edp_group_ = g.split(d % ep, d / ep, "edp");
  ep_ = ep;
}

Communicator& Mesh::expert_group(int ep) {
  make_expert_groups(ep);
  return *ep_group_;
}

Communicator& Mesh::expert_data_group(int ep) {
  make_expert_groups(ep);
  return *edp_group_;
}

Communicator& Mesh::expert_data_tp_group(int ep) {
  make_expert_groups(ep);
  if (size(Axis::tp) == 1) return *edp_group_;
  if (!edp_tp_group_) {
    // Colour: the place in the dp x cp group mod ep (the expert shard); key: the place in
    // tp x dp x cp.
    const int d = group({Axis::dp, Axis::cp}).rank();
    Communicator& all = group({Axis::tp, Axis::cp, Axis::dp});
    edp_tp_group_ = all.split(d % ep, all.rank(), "edpxtp");
  }
  return *edp_tp_group_;
}

Communicator& Mesh::grad_group(GradGroup g, int ep) {
  if (g.ep) return g.tp ? expert_data_tp_group(ep) : expert_data_group(ep);
  return g.tp ? group({Axis::tp, Axis::cp, Axis::dp}) : group({Axis::dp, Axis::cp});
}

Communicator& Mesh::hybrid_group(GradGroup g, int ep, int replicas, bool replica) {
  HybridGroups& h = hybrid_[{g.index(), replicas}];
  std::unique_ptr<Communicator>& c = replica ? h.replica : h.shard;
  if (c) return *c;
  Communicator& base = grad_group(g, ep);
  LLMT_CHECK(replicas >= 1 && base.size() % replicas == 0, "ZeRO's ", replicas,
             " replicas do not divide the ", base.name(), " group of ", base.size(), " ranks");
  const int chunk = base.size() / replicas, r = base.rank();
  // Another cut of this group made already: the new one's name tells its size.
  bool second = false;
  for (const auto& [key, other] : hybrid_)
    second |=
        key.first == g.index() && key.second != replicas && (replica ? other.replica : other.shard);
  const std::string name = base.name() + (replica ? "_replica" : "_shard") +
                           (second ? std::to_string(replica ? replicas : chunk) : "");
  c = replica ? base.split(r % chunk, r / chunk, name) : base.split(r / chunk, r % chunk, name);
  return *c;
}

Communicator& Mesh::zero_cross_group(GradGroup g, int ep, int replicas, int chunks) {
  if (replicas == 1) return zero_replica_group(g, ep, chunks);
  std::unique_ptr<Communicator>& c = cross_[{g.index(), replicas, chunks}];
  if (c) return *c;
  Communicator& shard = zero_shard_group(g, ep, replicas);
  LLMT_CHECK(chunks % replicas == 0 && shard.size() % (chunks / replicas) == 0, "qgZ's ", chunks,
             " chunks do not cut the ", shard.name(), " group of ", shard.size(), " ranks");
  const int chunk = shard.size() / (chunks / replicas), r = shard.rank();
  c = shard.split(r % chunk, r / chunk, grad_group(g, ep).name() + "_cross");
  return *c;
}

Communicator& Mesh::zero_shard_group(GradGroup g, int ep, int replicas) {
  return replicas == 1 ? grad_group(g, ep) : hybrid_group(g, ep, replicas, false);
}

Communicator& Mesh::zero_replica_group(GradGroup g, int ep, int replicas) {
  return hybrid_group(g, ep, replicas, true);
}

Communicator& Mesh::group(std::initializer_list<Axis> axes) {
  LLMT_CHECK(axes.size() > 0, "Mesh::group of no axis");
  unsigned mask = 0;
  int wide = 0, last = 0;
  for (Axis a : axes) {
    if (size(a) == 1 || (mask & (1u << static_cast<int>(a)))) continue;
    mask |= 1u << static_cast<int>(a);
    last = static_cast<int>(a);
    ++wide;
  }
  if (wide == 0) return comm(*axes.begin());  // degree 1: a group of this rank alone
  if (wide == 1) return comm(static_cast<Axis>(last));
  auto it = groups_.find(mask);
  if (it != groups_.end()) return *it->second;
  std::string name;  // "tpxdp"
  for (int a = 0; a < kNumAxes; ++a) {
    if (!(mask & (1u << a))) continue;
    if (!name.empty()) name += 'x';
    name += axis_name(static_cast<Axis>(a));
  }
  const std::vector<int> members = shape_.group(rank_, axes);
  const int key =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  auto comm = world_->split(members.front(), key, name);
  return *groups_.emplace(mask, std::move(comm)).first->second;
}

}  // namespace llmt
