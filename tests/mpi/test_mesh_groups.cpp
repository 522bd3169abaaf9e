// Mesh::group over sets of axes, under mpirun on 4 ranks (tp 2 x dp 2, and tp 2 x pp 2): exact
// members and ranks, the sum of an all-reduce over each group, and that degree-1 axes add no
// communicator (the set falls back to its one wide axis's).
#include <gtest/gtest.h>

#include <vector>

#include "engine/parallel/mesh.h"
#include "tests/mpi/mpi_test_main.h"

namespace llmt {
namespace {

// An owned copy of the world for Mesh::create.
Mesh make_mesh(int tp, int dp, int pp) {
  Communicator& w = mpi_test_world();
  MeshShape shape;
  shape.degree = {tp, 1, dp, pp};
  return Mesh::create(shape, w.split(0, w.rank(), "world"));
}

float sum_over(Communicator& c, float v) {
  c.all_reduce(Tensor(&v, {1}, DType::f32)).wait();
  return v;
}

TEST(MeshGroups, TwoWideAxesSplitTheWorld) {
  if (mpi_test_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const auto& [dp, pp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    Mesh mesh = make_mesh(2, dp, pp);
    const int r = mesh.rank();
    Communicator& g = mesh.group({Axis::tp, dp > 1 ? Axis::dp : Axis::pp});
    EXPECT_EQ(g.size(), 4);
    EXPECT_EQ(g.rank(), r);  // members in rank order
    EXPECT_EQ(sum_over(g, static_cast<float>(r + 1)), 10.0f);
    // Asked again: the same communicator, no new split.
    EXPECT_EQ(&mesh.group({dp > 1 ? Axis::dp : Axis::pp, Axis::tp}), &g);
    // cp has degree 1: {dp, cp} is the dp group, {tp, cp} the tp group.
    EXPECT_EQ(&mesh.group({Axis::dp, Axis::cp}), &mesh.comm(Axis::dp));
    EXPECT_EQ(&mesh.group({Axis::tp, Axis::cp}), &mesh.comm(Axis::tp));
    EXPECT_EQ(sum_over(mesh.group({Axis::tp, Axis::cp}), static_cast<float>(r)),
              static_cast<float>(r / 2 * 4 + 1));  // ranks 2k and 2k+1
  }
}

}  // namespace
}  // namespace llmt
