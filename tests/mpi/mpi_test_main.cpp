#include "tests/mpi/mpi_test_main.h"

#include <gtest/gtest.h>

#include <memory>

namespace llmt {
namespace {
Communicator* g_world = nullptr;
}  // namespace

Communicator& mpi_test_world() {
  return *g_world;
}

}  // namespace llmt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  llmt::CommRuntime runtime;
  std::unique_ptr<llmt::Communicator> world = llmt::make_world_communicator();
  llmt::g_world = world.get();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  // Every rank's verdict: a failure on any rank fails the run.
  int32_t bad = rc != 0;
  world->all_reduce(llmt::Tensor(&bad, {1}, llmt::DType::i32), llmt::ReduceOp::max).wait();
  world.reset();
  return bad ? 1 : 0;
}
