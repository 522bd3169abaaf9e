// NCCL collectives on a dedicated stream per communicator, ordered after the work already queued
// on the compute stream (an event the NCCL stream waits on, so a collective never reads a buffer
// a kernel is still writing); a Handle is a CUDA event recorded after the call: wait() blocks the
// host on it, device_wait() makes the compute stream wait on it (cudaStreamWaitEvent). Sends and
// receives go on p2p channels instead (communicator.h): one NCCL communicator and stream each,
// split off this one, because NCCL matches point-to-point calls in issue order and a blocked call
// holds its stream. Byte counts follow the same ring volumes as the MPI backend
// (Communicator::count_collective).
#include "engine/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "engine/comm/mpi/mpi_communicator.h"

#define LLMT_NCCL(call) LLMT_STATUS_CHECK(call, ncclSuccess, ncclGetErrorString)

namespace llmt {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::f64:
      return ncclFloat64;
  }
  return ncclUint8;
}

// A Handle's wait() blocks on its event; with comm.timeout_s set it polls the event instead
// (cudaEventSynchronize cannot time out) and past the timeout aborts the NCCL communicator the
// operation runs on (its kernels would spin forever) and then the job, naming the rank, the
// operation and the group as the MPI backend does. A compute stream that device_wait()ed on an
// operation that never completes is not watched (the next host synchronisation hangs).
class NcclHandle final : public Handle::Impl {
 public:
  NcclHandle(Communicator& owner, cudaEvent_t ev, ncclComm_t comm, const char* op)
      : owner_(owner), ev_(ev), comm_(comm), op_(op) {}
  ~NcclHandle() override {
    // After device_wait() the event may still be pending: CUDA releases it once it completes.
    if (!on_device_) cudaEventSynchronize(ev_);
    cudaEventDestroy(ev_);
  }
  void wait() override {
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    if (owner_.timeout() <= 0) {
      LLMT_CUDA_CHECK(cudaEventSynchronize(ev_));
    } else {
      for (;;) {
        const cudaError_t q = cudaEventQuery(ev_);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) LLMT_CUDA_CHECK(q);
        if (elapsed() > owner_.timeout()) {
          ncclCommAbort(comm_);
          mpi::watchdog_abort(owner_, op_);
        }
        std::this_thread::yield();
      }
    }
    owner_.add_wait_seconds(elapsed());
  }
  bool test() override { return cudaEventQuery(ev_) == cudaSuccess; }
  void device_wait() override {
    LLMT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda_compute_stream()), ev_, 0));
    on_device_ = true;
  }

 private:
  Communicator& owner_;
  cudaEvent_t ev_;
  ncclComm_t comm_;  // what the operation runs on: aborted by the watchdog
  const char* op_;   // "all_reduce", ... for the watchdog's message
  bool on_device_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device)
      : name_(bootstrap.name()), rank_(bootstrap.rank()), size_(bootstrap.size()), device_(device) {
    LLMT_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (rank_ == 0) LLMT_NCCL(ncclGetUniqueId(&id));
    static_assert(sizeof(ncclUniqueId) % 4 == 0);
    Tensor id_bytes(&id, {static_cast<int64_t>(sizeof id / 4)}, DType::i32);
    bootstrap.broadcast(id_bytes, 0).wait();
    LLMT_NCCL(ncclCommInitRank(&comm_, size_, id, rank_));
    LLMT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    set_timeout(bootstrap.timeout());  // the watchdog of the group it serves
  }
  ~NcclCommunicator() override {
    close_p2p_channels();
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  Handle all_reduce(Tensor x, ReduceOp op) override {
    check_device(x, "all_reduce");
    after_compute();
    LLMT_NCCL(ncclAllReduce(x.data, x.data, static_cast<size_t>(x.numel()), nccl_type(x.dtype),
                            op == ReduceOp::sum ? ncclSum : ncclMax, comm_, stream_));
    count_collective(CommKind::all_reduce, static_cast<int64_t>(x.nbytes()));
    return record("all_reduce");
  }
  Handle reduce_scatter(Tensor out, Tensor in) override {
    check_device(out, "reduce_scatter");
    check_blocks(out, in, "reduce_scatter");
    after_compute();
    LLMT_NCCL(ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()),
                                nccl_type(in.dtype), ncclSum, comm_, stream_));
    count_collective(CommKind::reduce_scatter, static_cast<int64_t>(in.nbytes()));
    return record("reduce_scatter");
  }
  Handle all_gather(Tensor out, Tensor in) override {
    check_device(out, "all_gather");
    check_blocks(in, out, "all_gather");
    after_compute();
    LLMT_NCCL(ncclAllGather(in.data, out.data, static_cast<size_t>(in.numel()), nccl_type(in.dtype),
                            comm_, stream_));
    count_collective(CommKind::all_gather, static_cast<int64_t>(out.nbytes()));
    return record("all_gather");
  }
  Handle broadcast(Tensor x, int root) override {
    check_device(x, "broadcast");
    after_compute();
    LLMT_NCCL(ncclBroadcast(x.data, x.data, static_cast<size_t>(x.numel()), nccl_type(x.dtype),
                            root, comm_, stream_));
    count_collective(CommKind::broadcast,
                     rank_ == size_ - 1 ? 0 : static_cast<int64_t>(x.nbytes()));
    return record("broadcast");
  }
  Handle all_to_all(Tensor out, Tensor in) override {
    check_device(out, "all_to_all");
    LLMT_CHECK(out.numel() == in.numel() && in.numel() % size_ == 0, name_, " all_to_all: in ",
               describe(in), ", out ", describe(out));
    const size_t n = static_cast<size_t>(in.numel() / size_);
    const size_t block = n * dtype_size(in.dtype);
    after_compute();
    LLMT_NCCL(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      LLMT_NCCL(ncclSend(static_cast<char*>(in.data) + r * block, n, nccl_type(in.dtype), r, comm_,
                         stream_));
      LLMT_NCCL(ncclRecv(static_cast<char*>(out.data) + r * block, n, nccl_type(in.dtype), r, comm_,
                         stream_));
    }
    LLMT_NCCL(ncclGroupEnd());
    count_collective(CommKind::all_to_all, static_cast<int64_t>(in.nbytes()));
    return record("all_to_all");
  }
  Handle all_to_allv(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                     std::span<const int64_t> in_counts) override {
    check_device(out, "all_to_allv");
    LLMT_CHECK(static_cast<int>(out_counts.size()) == size_ &&
                   static_cast<int>(in_counts.size()) == size_ && out.dtype == in.dtype,
               name_, " all_to_allv: ", in_counts.size(), " and ", out_counts.size(),
               " counts for ", size_, " ranks");
    const size_t es = dtype_size(in.dtype);
    after_compute();
    LLMT_NCCL(ncclGroupStart());
    int64_t s_off = 0, r_off = 0, sent = 0;
    for (int r = 0; r < size_; ++r) {
      if (in_counts[r] > 0)
        LLMT_NCCL(ncclSend(static_cast<char*>(in.data) + s_off * es,
                           static_cast<size_t>(in_counts[r]), nccl_type(in.dtype), r, comm_,
                           stream_));
      if (out_counts[r] > 0)
        LLMT_NCCL(ncclRecv(static_cast<char*>(out.data) + r_off * es,
                           static_cast<size_t>(out_counts[r]), nccl_type(in.dtype), r, comm_,
                           stream_));
      s_off += in_counts[r];
      r_off += out_counts[r];
      if (r != rank_) sent += in_counts[r];
    }
    LLMT_NCCL(ncclGroupEnd());
    LLMT_CHECK(s_off <= in.numel() && r_off <= out.numel(), name_, " all_to_allv: sends ", s_off,
               " of ", describe(in), ", receives ", r_off, " into ", describe(out));
    count(CommKind::all_to_all, sent * static_cast<int64_t>(es));
    return record("all_to_allv");
  }
  // On the tag's channel (communicator.h): matched in issue order with the peer's calls on the
  // same channel, on that channel's stream.
  Handle send(Tensor x, int peer, int tag) override {
    check_device(x, "send");
    const P2pChannel ch = channel(tag, peer, "send");
    after_compute(ch.stream);
    LLMT_NCCL(ncclSend(x.data, static_cast<size_t>(x.numel()), nccl_type(x.dtype), peer, ch.comm,
                       ch.stream));
    count_collective(CommKind::send, static_cast<int64_t>(x.nbytes()));
    return record(ch, "send");
  }
  Handle recv(Tensor x, int peer, int tag) override {
    check_device(x, "recv");
    const P2pChannel ch = channel(tag, peer, "recv");
    after_compute(ch.stream);
    LLMT_NCCL(ncclRecv(x.data, static_cast<size_t>(x.numel()), nccl_type(x.dtype), peer, ch.comm,
                       ch.stream));
    count_collective(CommKind::recv, static_cast<int64_t>(x.nbytes()));
    return record(ch, "recv");
  }
  // Grouped on the group's stream: every rank posts its send and receive together, so the ring
  // cannot deadlock whatever order the peers reach it.
  Handle send_recv(Tensor out, int to, Tensor in, int from, int tag) override {
    (void)tag;
    check_device(out, "send_recv");
    check_device(in, "send_recv");
    after_compute();
    LLMT_NCCL(ncclGroupStart());
    LLMT_NCCL(ncclSend(out.data, static_cast<size_t>(out.numel()), nccl_type(out.dtype), to, comm_,
                       stream_));
    LLMT_NCCL(ncclRecv(in.data, static_cast<size_t>(in.numel()), nccl_type(in.dtype), from, comm_,
                       stream_));
    LLMT_NCCL(ncclGroupEnd());
    count_collective(CommKind::send, static_cast<int64_t>(out.nbytes()));
    count_collective(CommKind::recv, static_cast<int64_t>(in.nbytes()));
    return record("send_recv");
  }
  // One NCCL communicator and stream per channel, split off this one (a collective).
  void open_p2p_channels(int n) override {
    if (static_cast<int>(channels_.size()) == n) return;
    close_p2p_channels();
    for (int c = 0; c < n; ++c) {
      P2pChannel ch;
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      LLMT_NCCL(ncclCommSplit(comm_, 0, rank_, &ch.comm, &config));
      channels_.push_back(ch);
      LLMT_CUDA_CHECK(cudaStreamCreateWithFlags(&channels_.back().stream, cudaStreamNonBlocking));
    }
  }
  void barrier() override {
    // An all-reduce of one int is NCCL's barrier.
    void* p = nullptr;
    LLMT_CUDA_CHECK(cudaMallocAsync(&p, 4, stream_));
    LLMT_NCCL(ncclAllReduce(p, p, 1, ncclInt32, ncclSum, comm_, stream_));
    LLMT_CUDA_CHECK(cudaFreeAsync(p, stream_));
    LLMT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    ncclComm_t sub = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    LLMT_NCCL(ncclCommSplit(comm_, color, key, &sub, &config));
    std::unique_ptr<Communicator> out(new NcclCommunicator(sub, name, device_));
    out->set_timeout(timeout());
    return out;
  }

 private:
  NcclCommunicator(ncclComm_t comm, std::string name, int device)
      : comm_(comm), name_(std::move(name)), device_(device) {
    LLMT_NCCL(ncclCommUserRank(comm_, &rank_));
    LLMT_NCCL(ncclCommCount(comm_, &size_));
    LLMT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  struct P2pChannel {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  void close_p2p_channels() {
    for (P2pChannel& ch : channels_) {
      cudaStreamSynchronize(ch.stream);
      ncclCommDestroy(ch.comm);
      cudaStreamDestroy(ch.stream);
    }
    channels_.clear();
  }
  // The tag's channel; this communicator and its stream while no channels are open.
  P2pChannel channel(int tag, int peer, const char* what) const {
    LLMT_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, " ", what, ": peer ", peer,
               " of rank ", rank_, " in a group of ", size_);
    if (channels_.empty()) return {comm_, stream_};
    return channels_[static_cast<size_t>(p2p_channel(tag, static_cast<int>(channels_.size())))];
  }
  // `stream` waits for everything queued on the compute stream so far.
  void after_compute(cudaStream_t stream) {
    cudaEvent_t ev;
    LLMT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    LLMT_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(cuda_compute_stream())));
    LLMT_CUDA_CHECK(cudaStreamWaitEvent(stream, ev, 0));
    LLMT_CUDA_CHECK(cudaEventDestroy(ev));
  }
  void after_compute() { after_compute(stream_); }
  // A Handle for what was just queued on `stream` (run on `comm`).
  Handle record(const P2pChannel& on, const char* op) {
    cudaEvent_t ev;
    LLMT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    LLMT_CUDA_CHECK(cudaEventRecord(ev, on.stream));
    return Handle(std::make_unique<NcclHandle>(*this, ev, on.comm, op));
  }
  Handle record(const char* op) { return record({comm_, stream_}, op); }
  void check_device(const Tensor& x, const char* what) const {
    LLMT_CHECK(x.device.kind == DeviceKind::cuda, name_, " ", what, " on ", describe(x),
               ": the NCCL backend moves GPU buffers");
  }
  void check_blocks(const Tensor& small, const Tensor& big, const char* what) const {
    LLMT_CHECK(big.numel() == small.numel() * size_ && big.dtype == small.dtype, name_, " ", what,
               ": ", describe(big), " must hold ", size_, " blocks of ", describe(small));
  }

  ncclComm_t comm_ = nullptr;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<P2pChannel> channels_;  // open_p2p_channels
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  return std::make_unique<NcclCommunicator>(bootstrap, device);
}

}  // namespace llmt
