// A stuck collective for the watchdog to judge (run by check_watchdog.sh under mpirun -np 4, with
// a watchdog of 1 s): ranks 0 and 2 start an all-reduce on the world group; rank 1 never calls
// any MPI function again (it computes, as a rank stuck in a kernel would); rank 3 waits in an
// all-reduce on the group {1, 3} (named "pair", watched for 60 s), which rank 1 never joins.
// The verdict of rank 0 or 2 must name ranks 1 and 3 as not having reached the world all-reduce,
// rank 1 as not answering and rank 3 as waiting in "pair". The job ends by MPI_Abort (exit 1).
#include <chrono>
#include <cstdio>
#include <thread>

#include "engine/comm/communicator.h"

int main() {
  using namespace llmt;
  CommRuntime runtime;
  auto world = make_world_communicator();
  world->set_timeout(1);
  const int rank = world->rank();
  // Two collectives every rank completes first: the stuck one is the world's third.
  float one = 1;
  world->all_reduce(Tensor(&one, {1}, DType::f32)).wait();
  auto pair =
      world->split(rank == 1 || rank == 3 ? 0 : 1, rank, rank == 1 || rank == 3 ? "pair" : "rest");
  pair->set_timeout(60);
  world->barrier();
  std::fprintf(stderr, "rank %d: ready\n", rank);
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
  } else if (rank == 3) {
    pair->all_reduce(Tensor(&one, {1}, DType::f32)).wait();
  } else {
    world->all_reduce(Tensor(&one, {1}, DType::f32)).wait();
  }
  std::fprintf(stderr, "rank %d: the stuck collective completed\n", rank);
  return 0;
}
