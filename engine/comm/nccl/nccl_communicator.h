// The NCCL backend (GPU buffers), built only with LLMTRAIN_CUDA. A group's NCCL communicator is
// bootstrapped over the same group's MPI communicator: rank 0 creates the unique id and
// broadcasts it, then every rank calls ncclCommInitRank. No <nccl.h> here.
#pragma once

#include <memory>

#include "engine/comm/communicator.h"

namespace llmt {

// `bootstrap`: a host (MPI) communicator over exactly the ranks of the new group, in rank order.
// `device`: the CUDA device this rank drives (local_rank_from_env() in a one-GPU-per-rank run).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);

}  // namespace llmt
