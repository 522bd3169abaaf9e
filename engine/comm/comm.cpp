// What every backend shares: the ring-volume byte counting, the launcher environment (is this
// an mpirun/srun process, which local rank), and the runtime/world factory that picks MPI or local.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "engine/comm/communicator.h"
#ifdef LLMTRAIN_HAVE_MPI
#include "engine/comm/mpi/mpi_communicator.h"
#endif

namespace llmt {

std::string_view comm_kind_name(CommKind k) {
  switch (k) {
    case CommKind::all_reduce:
      return "all_reduce";
    case CommKind::reduce_scatter:
      return "reduce_scatter";
    case CommKind::all_gather:
      return "all_gather";
    case CommKind::broadcast:
      return "broadcast";
    case CommKind::all_to_all:
      return "all_to_all";
    case CommKind::send:
      return "send";
    case CommKind::recv:
      return "recv";
  }
  return "?";
}

void Communicator::count_collective(CommKind k, int64_t nbytes) {
  const int64_t p = size();
  int64_t moved = 0;
  if (p > 1) {
    switch (k) {
      case CommKind::all_reduce:
        moved = 2 * (p - 1) * nbytes / p;
        break;
      case CommKind::reduce_scatter:
      case CommKind::all_gather:
      case CommKind::all_to_all:
        moved = (p - 1) * nbytes / p;
        break;
      case CommKind::broadcast:
      case CommKind::send:
      case CommKind::recv:
        moved = nbytes;
        break;
    }
  }
  count(k, moved);
}

namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
}  // namespace

bool launched_distributed() {
  return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK") ||
         (env("SLURM_PROCID") && env("SLURM_NTASKS") && std::atoi(env("SLURM_NTASKS")) > 1);
}

int local_rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* v = env(name)) return std::atoi(v);
  }
  return 0;
}

int local_size_from_env() {
  if (const char* v = env("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(v));
  // Slurm: "2" or "2(x3)" tasks per node; the leading count is this node's on even layouts.
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
    if (const char* v = env(name)) return std::max(1, std::atoi(v));
  return 1;
}

int world_rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = env(name)) return std::atoi(v);
  return 0;
}

const char* launcher_name() {
  if (env("OMPI_COMM_WORLD_SIZE")) return "mpirun";
  if (env("SLURM_PROCID") && launched_distributed()) return "srun";
  if (env("PMIX_RANK") || env("PMI_RANK")) return "pmi";
  return "none";
}

CommRuntime::CommRuntime() {
  if (!launched_distributed()) return;
#ifdef LLMTRAIN_HAVE_MPI
  mpi::init();
  distributed_ = true;
#else
  throw Error(
      "this process was started by mpirun/srun, but llmtrain was built without MPI "
      "(install libopenmpi-dev and rebuild)");
#endif
}

CommRuntime::~CommRuntime() {
#ifdef LLMTRAIN_HAVE_MPI
  if (distributed_) mpi::finalize();
#endif
}

void CommRuntime::abort_world(int code) const {
  LLMT_CHECK(distributed_, "abort_world: not a distributed run");
#ifdef LLMTRAIN_HAVE_MPI
  mpi::abort_world(code);
#endif
  std::abort();
}

std::unique_ptr<Communicator> make_world_communicator() {
#ifdef LLMTRAIN_HAVE_MPI
  if (launched_distributed()) return mpi::world();
#endif
  return make_local_communicator("world");
}

namespace {

// Both of two operations: complete when both are.
class BothHandles final : public Handle::Impl {
 public:
  BothHandles(Handle a, Handle b) : a_(std::move(a)), b_(std::move(b)) {}
  void wait() override {
    a_.wait();
    b_.wait();
  }
  bool test() override {
    const bool a = a_.poll();
    const bool b = b_.poll();
    return a && b;
  }
  void device_wait() override {
    a_.device_wait();
    b_.device_wait();
  }

 private:
  Handle a_, b_;
};

}  // namespace

Handle Communicator::send_recv(Tensor out, int to, Tensor in, int from, int tag) {
  Handle s = send(out, to, tag);
  Handle r = recv(in, from, tag);
  return Handle(std::make_unique<BothHandles>(std::move(s), std::move(r)));
}

}  // namespace llmt
