// Communicator: the collectives and point-to-point calls of one process group, on buffers of one
// device. Implementations: MPI (CPU buffers; also the bootstrap), NCCL (GPU buffers; compiled
// with LLMTRAIN_CUDA), local (a group of one, no MPI). Every call is non-blocking and returns a
// Handle to wait on; every call counts the bytes it moves per kind, so metrics can report the
// traffic of each mesh axis per step. No MPI or NCCL type appears here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"

namespace llmt {

enum class ReduceOp : uint8_t { sum, max };
enum class CommKind : uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  all_to_all,
  send,
  recv
};
constexpr int kNumCommKinds = 7;

// Completion of a non-blocking call. wait() is idempotent; a default Handle is complete.
class Handle {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
    // Non-blocking completion check that also drives the library's progress engine (MPI's
    // non-blocking collectives advance only inside MPI calls). Default: not known to be done.
    virtual bool test() { return false; }
    // (Optional) Makes the device's compute stream wait for the operation, not the host.
    // Default (no device stream: MPI, local): wait().
    virtual void device_wait() { wait(); }
  };
  Handle() = default;
  explicit Handle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait() {
    if (impl_) impl_->wait();
    impl_.reset();
  }
  // For a result whose only reader is a kernel queued afterwards on the compute stream: the
  // stream waits for the operation and the host goes on (NCCL: cudaStreamWaitEvent). Not when
  // the host reads the buffer or frees or refills it next: use wait(). MPI and local: wait().
  void device_wait() {
    if (impl_) impl_->device_wait();
    impl_.reset();
  }
  bool done() const { return !impl_; }
  // Advances the operation without blocking; true once it is complete.
  bool poll() {
    if (impl_ && impl_->test()) impl_.reset();
    return !impl_;
  }

 private:
  std::unique_ptr<Impl> impl_;
};

// Bytes this rank sent per kind (for a collective: the algorithm-independent volume a ring
// implementation moves, e.g. all-reduce of n bytes = 2 (p-1)/p n; see docs/parallelism.md).
struct CommCounters {
  int64_t bytes[kNumCommKinds] = {};
  int64_t calls[kNumCommKinds] = {};
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "dp", "tp", "world"

  // In place: x = op over ranks of x.
  virtual Handle all_reduce(Tensor x, ReduceOp op = ReduceOp::sum) = 0;
  // in (size * n) -> out (n): out = this rank's block of the sum over ranks.
  virtual Handle reduce_scatter(Tensor out, Tensor in) = 0;
  // in (n) -> out (size * n): rank r's in lands at block r.
  virtual Handle all_gather(Tensor out, Tensor in) = 0;
  virtual Handle broadcast(Tensor x, int root) = 0;
  // in (size * n) -> out (size * n): block r of in goes to rank r; block r of out came from r.
  virtual Handle all_to_all(Tensor out, Tensor in) = 0;
  // Blocks of any size: the first in_counts[0] elements of `in` go to rank 0, the next
  // in_counts[1] to rank 1, ...; `out` receives out_counts[r] elements from rank r, in rank
  // order (counts in elements, host memory, size() of each; every rank's in_counts[q] must equal
  // rank q's out_counts[rank]). Expert parallelism's dispatch and combine. Counted as the bytes
  // this rank sends to the others (all_to_all).
  virtual Handle all_to_allv(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                             std::span<const int64_t> in_counts) = 0;
  // Point to point. MPI matches a receive to the send with its tag. NCCL ignores tags apart from
  // their channel, p2p_channel(tag, n) after open_p2p_channels(n) (else one channel): on each
  // channel, the k-th send from rank a to rank b meets b's k-th receive from a; each channel is
  // one stream per rank, and a call holds its stream until the peer's stream reaches the
  // matching call. So a caller that must work on both gives every stream of a rank one role
  // (sends to one peer, or receives from one) and posts each link's messages in the same order
  // on both sides (the pipeline executor: p2p_tag in engine/schedule/schedule.h).
  virtual Handle send(Tensor x, int peer, int tag = 0) = 0;
  virtual Handle recv(Tensor x, int peer, int tag = 0) = 0;
  // The ring exchange: sends `out` to rank `to` and receives `in` from rank `from` as one
  // operation that cannot deadlock against the same call on the other ranks (context
  // parallelism's K/V ring). Default: send + recv with the tag (MPI matches them); NCCL groups the
  // two on the group's own stream, apart from the p2p channels.
  virtual Handle send_recv(Tensor out, int to, Tensor in, int from, int tag = 0);
  // (Optional) Collective over the group: sets up `n` p2p channels (NCCL: one communicator and
  // stream each). Backends that match by tag (MPI, local) need none.
  virtual void open_p2p_channels(int n) { (void)n; }
  virtual void barrier() = 0;
  // Collective over this group: the ranks passing the same `color` form a new group, ordered
  // by `key` (MPI_Comm_split semantics). Used by the Mesh to build one group per axis.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // (Virtual: a communicator made of others, make_device_routed, reports theirs.)
  virtual CommCounters counters() const { return counters_; }
  virtual void reset_counters() { counters_ = {}; }
  // Seconds spent blocked in Handle::wait() since the last reset (how much communication was
  // not hidden behind compute).
  virtual double wait_seconds() const { return wait_s_; }
  virtual void reset_wait_seconds() { wait_s_ = 0; }
  void add_wait_seconds(double s) { wait_s_ += s; }
  // The watchdog (comm.timeout_s): seconds a Handle::wait may block before the job is aborted,
  // naming this rank, the operation, the group and (MPI) the ranks that did not reach it; 0 =
  // wait forever. Groups split from this one
  // inherit it. The MPI backend enforces it; the local one never blocks; NCCL does not yet.
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

 protected:
  // Ring volume per kind (docs/parallelism.md): all-reduce of n bytes 2(p-1)/p n, reduce-scatter
  // of n input bytes and all-gather of n output bytes (p-1)/p n, all-to-all (p-1)/p n,
  // broadcast n (each rank but the last forwards it once), send/recv n.
  void count_collective(CommKind k, int64_t nbytes);
  void count(CommKind k, int64_t bytes) {
    counters_.bytes[static_cast<int>(k)] += bytes;
    counters_.calls[static_cast<int>(k)] += 1;
  }

 private:
  CommCounters counters_;
  double wait_s_ = 0;
  double timeout_s_ = 0;
};

std::string_view comm_kind_name(CommKind k);

// The channel of a message tag among `n` p2p channels (Communicator::send/recv).
constexpr int p2p_channel(int tag, int n) {
  return n > 1 ? tag % n : 0;
}

// A group of one: every collective is a copy (or nothing), send/recv are errors. No MPI.
std::unique_ptr<Communicator> make_local_communicator(const std::string& name = "world");
// A group's shape without its ranks: rank `rank` of `size`, for a model built on the meta device
// (make_meta_backend) to count its buffers. Every collective, send and receive is an error (under
// ops::Recording, where the model runs a step to count its ops' bytes, one that does nothing); a
// group split from it exists, but its rank and size are errors too.
std::unique_ptr<Communicator> make_shape_communicator(int rank, int size, const std::string& name);

// True when this process was started by mpirun/srun (Open MPI, PMIx or Slurm environment).
bool launched_distributed();
// This process's index among the ranks on its node (the GPU it drives): OMPI_COMM_WORLD_LOCAL_RANK
// or SLURM_LOCALID; 0 when neither is set.
int local_rank_from_env();
// The ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE, or Slurm's tasks on this node); 1 when
// not launched.
int local_size_from_env();
// This process's rank in the launch, from the launcher's environment, before MPI starts
// (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID); 0 when not launched.
int world_rank_from_env();
// "mpirun", "srun", "pmi" (another PMI launcher) or "none".
const char* launcher_name();

// Owns the process-wide communication runtime: MPI_Init_thread at construction and
// MPI_Finalize at destruction when launched_distributed() (and MPI is built in), nothing
// otherwise. The app creates exactly one before any communicator and keeps it to the end.
class CommRuntime {
 public:
  CommRuntime();
  ~CommRuntime();
  CommRuntime(const CommRuntime&) = delete;
  CommRuntime& operator=(const CommRuntime&) = delete;
  bool distributed() const { return distributed_; }
  // Ends every rank of the job now with exit code `code` (MPI_Abort), for a failure on one rank:
  // the others would otherwise wait in their next collective forever, and so would this one in
  // freeing its communicators. Only when distributed().
  [[noreturn]] void abort_world(int code) const;

 private:
  bool distributed_ = false;
};

// The world group: MPI when launched by mpirun/srun (a CommRuntime must be alive), local
// otherwise.
std::unique_ptr<Communicator> make_world_communicator();

// Builds the GPU communicator of a group from the group's host communicator (the bootstrap).
using GpuCommFactory = std::function<std::unique_ptr<Communicator>(Communicator& host_group)>;

// A group whose calls go by the tensors' device: CUDA tensors through the group's GPU
// communicator (NCCL), host tensors (loss and norm scalars, flags) through `host` (MPI). split()
// splits `host` and bootstraps the new group's GPU communicator from it with `make_gpu`. Counters
// and wait time are the sum of both.
std::unique_ptr<Communicator> make_device_routed(std::unique_ptr<Communicator> host,
                                                 GpuCommFactory make_gpu);
// The factory of NCCL communicators driving CUDA device `device`; throws Error when this build
// has no NCCL.
GpuCommFactory nccl_factory(int device);

}  // namespace llmt
