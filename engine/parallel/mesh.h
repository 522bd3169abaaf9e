// Mesh: the world's ranks arranged on named axes tp, cp, dp, pp (tp fastest-varying, Megatron
// order), with one Communicator per axis group this rank belongs to. Worked example: with
// tp=2, dp=2, pp=2 (world 8), rank 5 = tp 1 + 2*(cp 0) + 2*(dp 0) + 4*(pp 1): it shares its tp
// group with rank 4, its dp group with rank 7, its pp group with rank 1.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace llmt {

enum class Axis : uint8_t { tp, cp, dp, pp };
constexpr int kNumAxes = 4;
std::string_view axis_name(Axis a);

// Degrees and coordinates only: pure arithmetic, usable without MPI (`config show --world`).
struct MeshShape {
  std::array<int, kNumAxes> degree{1, 1, 1, 1};  // indexed by Axis
  int world() const { return degree[0] * degree[1] * degree[2] * degree[3]; }
  int size(Axis a) const { return degree[static_cast<int>(a)]; }
  // Coordinate of `rank` on each axis.
  std::array<int, kNumAxes> coords(int rank) const;
  int rank_of(const std::array<int, kNumAxes>& coords) const;
  // The global ranks of `rank`'s group along axis a, in axis order.
  std::vector<int> group(int rank, Axis a) const;
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
  int coord(Axis a) const { return coords_[static_cast<int>(a)]; }
  int size(Axis a) const { return shape_.size(a); }
  Communicator& comm(Axis a) const { return *axes_[static_cast<int>(a)]; }
  Communicator& world() const { return *world_; }

 private:
  MeshShape shape_;
  int rank_;
  std::array<int, kNumAxes> coords_;
  std::array<std::unique_ptr<Communicator>, kNumAxes> axes_;
  std::unique_ptr<Communicator> world_;
};

}  // namespace llmt
