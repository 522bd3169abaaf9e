// Communicator: the collectives and point-to-point calls of one process group, on buffers of one
// device. Implementations: MPI (CPU buffers; also the bootstrap), NCCL (GPU buffers; compiled
// with LLMTRAIN_CUDA), local (a group of one, no MPI). Every call is non-blocking and returns a
// Handle to wait on; every call counts the bytes it moves per kind, so metrics can report the
// traffic of each mesh axis per step. No MPI or NCCL type appears here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/tensor.h"

namespace llmt {

enum class ReduceOp : uint8_t { sum, max };
enum class CommKind : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send, recv };
constexpr int kNumCommKinds = 7;

// Completion of a non-blocking call. wait() is idempotent; a default Handle is complete.
class Handle {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
  };
  Handle() = default;
  explicit Handle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait() {
    if (impl_) impl_->wait();
    impl_.reset();
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
  virtual Handle send(Tensor x, int peer, int tag = 0) = 0;
  virtual Handle recv(Tensor x, int peer, int tag = 0) = 0;
  virtual void barrier() = 0;

  const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

 protected:
  void count(CommKind k, int64_t bytes) {
    counters_.bytes[static_cast<int>(k)] += bytes;
    counters_.calls[static_cast<int>(k)] += 1;
  }

 private:
  CommCounters counters_;
};

}  // namespace llmt
