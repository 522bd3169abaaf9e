// Open MPI backend: non-blocking collectives (MPI_I*) on host buffers, one MPI communicator per
// group (MPI_Comm_split). Every MPI call goes through LLMT_MPI, which names the call on failure.
#include "engine/comm/mpi/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/check.h"
#include "engine/comm/mpi/watch.h"
#include "kernels/ops.h"

#define LLMT_MPI(call)                                                                         \
  do {                                                                                         \
    const int llmt_mpi_rc = (call);                                                            \
    if (llmt_mpi_rc != MPI_SUCCESS) ::llmt::mpi::fail(__FILE__, __LINE__, #call, llmt_mpi_rc); \
  } while (0)

namespace llmt::mpi {

[[noreturn]] void fail(const char* file, int line, const char* call, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(detail::concat(file, ":", line, ": ", call, " failed: ", std::string(text, len)));
}

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT32_T;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;  // moved, never reduced
  }
  return MPI_BYTE;
}

// The sum of 16-bit values (train.grad_dtype = "compute"): each pair added in fp32 and rounded to
// the type, as a bf16/f16 all-reduce on the GPU adds. MPI calls it inside the rank's own MPI calls
// (no progress thread), on host buffers.
template <DType T>
void sum_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  ops::add_inplace(Tensor(inout, {*len}, T), Tensor(in, {*len}, T));
}

template <DType T>
MPI_Op sum_op_16bit() {
  static const MPI_Op op = [] {
    MPI_Op o;
    LLMT_MPI(MPI_Op_create(&sum_16bit<T>, /*commute=*/1, &o));
    return o;
  }();
  return op;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (op == ReduceOp::sum && t == DType::bf16) return sum_op_16bit<DType::bf16>();
  if (op == ReduceOp::sum && t == DType::f16) return sum_op_16bit<DType::f16>();
  return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
}

class MpiCommunicator;

class MpiHandle final : public Handle::Impl {
 public:
  // keep: what must outlive the operation (all_to_allv's count arrays), released with it.
  MpiHandle(MpiCommunicator& owner, MPI_Request req, WaitPoint at,
            std::shared_ptr<const void> keep = nullptr)
      : owner_(owner), req_(req), at_(at), keep_(std::move(keep)) {}
  ~MpiHandle() override {
    // A dropped handle must still complete: MPI owns the buffers until then.
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  void wait() override;  // below MpiCommunicator
  bool test() override {
    int flag = 0;
    LLMT_MPI(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }

 private:
  MpiCommunicator& owner_;
  MPI_Request req_;
  WaitPoint at_;  // the operation, for the watchdog
  std::shared_ptr<const void> keep_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, std::shared_ptr<Watch> watch)
      : comm_(comm), name_(std::move(name)), watch_(std::move(watch)) {
    LLMT_MPI(MPI_Comm_rank(comm_, &rank_));
    LLMT_MPI(MPI_Comm_size(comm_, &size_));
    // The members' world ranks and the group's key, for the watchdog.
    MPI_Group mine, world;
    LLMT_MPI(MPI_Comm_group(comm_, &mine));
    LLMT_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> ranks(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) ranks[r] = r;
    watched_.world_ranks.resize(ranks.size());
    LLMT_MPI(
        MPI_Group_translate_ranks(mine, size_, ranks.data(), world, watched_.world_ranks.data()));
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    watched_.name = name_;
    watched_.key = group_key(name_, watched_.world_ranks);
    watch_->add(&watched_);
  }
  ~MpiCommunicator() override {
    watch_->remove(&watched_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  Handle all_reduce(Tensor x, ReduceOp op) override {
    check_host(x, "all_reduce");
    const bool sixteen = x.dtype == DType::bf16 || x.dtype == DType::f16;
    LLMT_CHECK(x.dtype == DType::f32 || x.dtype == DType::i32 || x.dtype == DType::f64 ||
                   (sixteen && op == ReduceOp::sum),
               name_, " all_reduce of ", dtype_name(x.dtype),
               ": f32, i32 and f64 reduce on the CPU, bf16 and f16 sum");
    MPI_Request req;
    LLMT_MPI(MPI_Iallreduce(MPI_IN_PLACE, x.data, count_of(x), mpi_type(x.dtype),
                            mpi_op(op, x.dtype), comm_, &req));
    count_collective(CommKind::all_reduce, static_cast<int64_t>(x.nbytes()));
    return handle(req, "all_reduce");
  }
  Handle reduce_scatter(Tensor out, Tensor in) override {
    check_host(out, "reduce_scatter");
    check_blocks(out, in, "reduce_scatter");
    MPI_Request req;
    LLMT_MPI(MPI_Ireduce_scatter_block(in.data, out.data, count_of(out), mpi_type(in.dtype),
                                       mpi_op(ReduceOp::sum, in.dtype), comm_, &req));
    count_collective(CommKind::reduce_scatter, static_cast<int64_t>(in.nbytes()));
    return handle(req, "reduce_scatter");
  }
  Handle all_gather(Tensor out, Tensor in) override {
    check_host(out, "all_gather");
    check_blocks(in, out, "all_gather");
    MPI_Request req;
    LLMT_MPI(MPI_Iallgather(in.data, count_of(in), mpi_type(in.dtype), out.data, count_of(in),
                            mpi_type(in.dtype), comm_, &req));
    count_collective(CommKind::all_gather, static_cast<int64_t>(out.nbytes()));
    return handle(req, "all_gather");
  }
  Handle broadcast(Tensor x, int root) override {
    check_host(x, "broadcast");
    MPI_Request req;
    LLMT_MPI(MPI_Ibcast(x.data, count_of(x), mpi_type(x.dtype), root, comm_, &req));
    count_collective(CommKind::broadcast,
                     rank_ == size_ - 1 ? 0 : static_cast<int64_t>(x.nbytes()));
    return handle(req, "broadcast");
  }
  Handle all_to_all(Tensor out, Tensor in) override {
    check_host(out, "all_to_all");
    LLMT_CHECK(out.numel() == in.numel() && in.numel() % size_ == 0, name_, " all_to_all: in ",
               describe(in), ", out ", describe(out), " must have the same size, a multiple of ",
               size_);
    MPI_Request req;
    const int n = static_cast<int>(in.numel() / size_);
    LLMT_MPI(MPI_Ialltoall(in.data, n, mpi_type(in.dtype), out.data, n, mpi_type(in.dtype), comm_,
                           &req));
    count_collective(CommKind::all_to_all, static_cast<int64_t>(in.nbytes()));
    return handle(req, "all_to_all");
  }
  Handle all_to_allv(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                     std::span<const int64_t> in_counts) override {
    check_host(out, "all_to_allv");
    check_host(in, "all_to_allv");
    LLMT_CHECK(static_cast<int>(out_counts.size()) == size_ &&
                   static_cast<int>(in_counts.size()) == size_ && out.dtype == in.dtype,
               name_, " all_to_allv: ", in_counts.size(), " and ", out_counts.size(),
               " counts for ", size_, " ranks");
    // MPI keeps the count arrays until the operation completes: they live in the handle.
    auto arrays = std::make_shared<std::array<std::vector<int>, 4>>();
    auto& [sc, sd, rc, rd] = *arrays;
    int64_t s_total = 0, r_total = 0, sent = 0;
    for (int r = 0; r < size_; ++r) {
      sd.push_back(static_cast<int>(s_total));
      sc.push_back(static_cast<int>(in_counts[r]));
      rd.push_back(static_cast<int>(r_total));
      rc.push_back(static_cast<int>(out_counts[r]));
      s_total += in_counts[r];
      r_total += out_counts[r];
      if (r != rank_) sent += in_counts[r];
    }
    LLMT_CHECK(s_total <= in.numel() && r_total <= out.numel(), name_, " all_to_allv: sends ",
               s_total, " of ", describe(in), ", receives ", r_total, " into ", describe(out));
    MPI_Request req;
    LLMT_MPI(MPI_Ialltoallv(in.data, sc.data(), sd.data(), mpi_type(in.dtype), out.data, rc.data(),
                            rd.data(), mpi_type(in.dtype), comm_, &req));
    count(CommKind::all_to_all, sent * static_cast<int64_t>(dtype_size(in.dtype)));
    return handle(req, "all_to_allv", arrays);
  }
  Handle send(Tensor x, int peer, int tag) override {
    check_host(x, "send");
    MPI_Request req;
    LLMT_MPI(MPI_Isend(x.data, count_of(x), mpi_type(x.dtype), peer, tag, comm_, &req));
    count_collective(CommKind::send, static_cast<int64_t>(x.nbytes()));
    return p2p_handle(req, "send", peer);
  }
  Handle recv(Tensor x, int peer, int tag) override {
    check_host(x, "recv");
    MPI_Request req;
    LLMT_MPI(MPI_Irecv(x.data, count_of(x), mpi_type(x.dtype), peer, tag, comm_, &req));
    count_collective(CommKind::recv, static_cast<int64_t>(x.nbytes()));
    return p2p_handle(req, "recv", peer);
  }
  void barrier() override {
    MPI_Request req;
    LLMT_MPI(MPI_Ibarrier(comm_, &req));
    handle(req, "barrier").wait();
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm sub;
    LLMT_MPI(MPI_Comm_split(comm_, color, key, &sub));
    auto out = std::make_unique<MpiCommunicator>(sub, name, watch_);
    out->set_timeout(timeout());
    return out;
  }

 private:
  friend class MpiHandle;
  // A collective: numbered on the group (what the watchdog compares across ranks).
  Handle handle(MPI_Request req, const char* op, std::shared_ptr<const void> keep = nullptr) {
    const WaitPoint at{&watched_, op, ++watched_.started, -1};
    return Handle(std::make_unique<MpiHandle>(*this, req, at, std::move(keep)));
  }
  // A send or receive with group rank `peer`.
  Handle p2p_handle(MPI_Request req, const char* op, int peer) {
    return Handle(std::make_unique<MpiHandle>(*this, req, WaitPoint{&watched_, op, 0, peer}));
  }
  void check_host(const Tensor& x, const char* what) const {
    LLMT_CHECK(x.device.kind == DeviceKind::cpu, name_, " ", what, " on ", describe(x),
               ": the MPI backend moves host buffers (GPU tensors go through NCCL)");
  }
  int count_of(const Tensor& x) const {
    LLMT_CHECK(x.numel() <= INT32_MAX, name_, ": ", describe(x), " exceeds MPI's int count");
    return static_cast<int>(x.numel());
  }
  // big = size * small elements, same dtype.
  void check_blocks(const Tensor& small, const Tensor& big, const char* what) const {
    LLMT_CHECK(big.numel() == small.numel() * size_ && big.dtype == small.dtype, name_, " ", what,
               ": ", describe(big), " must hold ", size_, " blocks of ", describe(small));
  }
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Watch> watch_;  // shared by every group of this process
  WatchedGroup watched_;
};

void MpiHandle::wait() {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double timeout = owner_.timeout();
  if (timeout <= 0) {
    LLMT_MPI(MPI_Wait(&req_, MPI_STATUS_IGNORE));
  } else {
    // MPI_Wait spins too; testing instead lets the clock be read between turns, and another
    // rank's watchdog learn where this one waits.
    Watch& watch = *owner_.watch_;
    watch.begin_wait(at_);
    for (int flag = 0;;) {
      LLMT_MPI(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (flag) break;
      watch.serve();
      // The verdict asks the other ranks for a quarter of the timeout, 1 to 10 s.
      if (elapsed() > timeout) watch.verdict(at_, timeout, std::clamp(timeout / 4, 1.0, 10.0));
    }
    watch.end_wait();
  }
  owner_.add_wait_seconds(elapsed());
}

}  // namespace

void init() {
  int initialized = 0;
  LLMT_MPI(MPI_Initialized(&initialized));
  if (initialized) return;
  int provided = 0;
  LLMT_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void abort_world(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; should it, this rank still ends
}

// Another rank stopped, died or waits in a different collective; nothing this rank does can
// finish it.
void watchdog_abort(const Communicator& group, const char* op) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr,
               "error: rank %d: %s on group %s (%d ranks) did not complete within %g s "
               "(comm.timeout_s): another rank stopped, died or is in a different collective; "
               "aborting the job\n",
               world_rank, op, group.name().c_str(), group.size(), group.timeout());
  std::fflush(stderr);
  abort_world(1);
}

std::unique_ptr<Communicator> world() {
  int initialized = 0;
  LLMT_MPI(MPI_Initialized(&initialized));
  LLMT_CHECK(initialized, "MPI world communicator requested before CommRuntime started MPI");
  MPI_Comm dup;
  LLMT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(dup, "world", std::make_shared<Watch>());
}

}  // namespace llmt::mpi
