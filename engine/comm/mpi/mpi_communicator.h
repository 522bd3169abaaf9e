// The Open MPI backend's entry points. This header is private to engine/comm (no <mpi.h> here
// either, so comm.cpp can call it without MPI types).
#pragma once

#include <memory>

#include "engine/comm/communicator.h"

namespace llmt::mpi {

// MPI_Init_thread(FUNNELED: only the main thread calls MPI; OpenMP workers never do).
void init();
void finalize();
// MPI_Abort on MPI_COMM_WORLD: ends every rank of the job with `code`.
[[noreturn]] void abort_world(int code);
// The NCCL backend's watchdog verdict (comm.timeout_s): `op` on `group` has not completed in
// time. Prints which rank, operation and group, then ends the job (abort_world(1)). The MPI
// backend's own groups ask the other ranks first and name those that did not arrive (watch.h).
[[noreturn]] void watchdog_abort(const Communicator& group, const char* op);
// MPI_COMM_WORLD as a Communicator named "world" (a duplicate, so library traffic and ours never
// match each other's messages).
std::unique_ptr<Communicator> world();

}  // namespace llmt::mpi
