// The main() of the gtest programs run under mpirun (mpi_test_main.cpp): it starts the
// communication runtime, gives the tests the world group, prints results on rank 0 only, and
// fails the run when a test failed on any rank.
#pragma once

#include "engine/comm/communicator.h"

namespace llmt {

// The world group (MPI under mpirun, a group of one otherwise); valid while the tests run.
Communicator& mpi_test_world();

}  // namespace llmt
