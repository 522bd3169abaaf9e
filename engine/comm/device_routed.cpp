// make_device_routed: one group seen through two communicators, GPU buffers through NCCL and host
// buffers through MPI (docs/gpu.md). The engine passes tensors of both kinds to the same axis
// communicator: gradients and activations live on the device, while loss means, norm partial sums
// and overflow flags are host scalars.
#include "core/check.h"
#include "engine/comm/communicator.h"
#ifdef LLMTRAIN_HAVE_NCCL
#include "engine/comm/nccl/nccl_communicator.h"
#endif

namespace llmt {
namespace {

class DeviceRouted final : public Communicator {
 public:
  DeviceRouted(std::unique_ptr<Communicator> host, GpuCommFactory make_gpu)
      : host_(std::move(host)), make_gpu_(std::move(make_gpu)), gpu_(make_gpu_(*host_)) {
    LLMT_CHECK(gpu_->size() == host_->size() && gpu_->rank() == host_->rank(), host_->name(),
               ": the GPU communicator has rank ", gpu_->rank(), " of ", gpu_->size(),
               ", the host one ", host_->rank(), " of ", host_->size());
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  Handle all_reduce(Tensor x, ReduceOp op) override { return of(x).all_reduce(x, op); }
  Handle reduce_scatter(Tensor out, Tensor in) override {
    return of(out, in).reduce_scatter(out, in);
  }
  Handle all_gather(Tensor out, Tensor in) override { return of(out, in).all_gather(out, in); }
  Handle broadcast(Tensor x, int root) override { return of(x).broadcast(x, root); }
  Handle all_to_all(Tensor out, Tensor in) override { return of(out, in).all_to_all(out, in); }
  Handle all_to_allv(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                     std::span<const int64_t> in_counts) override {
    return of(out, in).all_to_allv(out, out_counts, in, in_counts);
  }
  Handle send(Tensor x, int peer, int tag) override { return of(x).send(x, peer, tag); }
  Handle recv(Tensor x, int peer, int tag) override { return of(x).recv(x, peer, tag); }
  Handle send_recv(Tensor out, int to, Tensor in, int from, int tag) override {
    return of(out, in).send_recv(out, to, in, from, tag);
  }
  void open_p2p_channels(int n) override {
    host_->open_p2p_channels(n);
    gpu_->open_p2p_channels(n);
  }
  void barrier() override { host_->barrier(); }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return std::make_unique<DeviceRouted>(host_->split(color, key, name), make_gpu_);
  }

  CommCounters counters() const override {
    CommCounters c = host_->counters();
    const CommCounters g = gpu_->counters();
    for (int k = 0; k < kNumCommKinds; ++k) {
      c.bytes[k] += g.bytes[k];
      c.calls[k] += g.calls[k];
    }
    return c;
  }
  void reset_counters() override {
    host_->reset_counters();
    gpu_->reset_counters();
  }
  double wait_seconds() const override { return host_->wait_seconds() + gpu_->wait_seconds(); }
  void reset_wait_seconds() override {
    host_->reset_wait_seconds();
    gpu_->reset_wait_seconds();
  }

 private:
  Communicator& of(const Tensor& x) { return x.device.kind == DeviceKind::cuda ? *gpu_ : *host_; }
  Communicator& of(const Tensor& out, const Tensor& in) {
    LLMT_CHECK(out.device.kind == in.device.kind, name(), ": ", describe(in), " and ",
               describe(out), " are on different devices");
    return of(out);
  }

  std::unique_ptr<Communicator> host_;
  GpuCommFactory make_gpu_;
  std::unique_ptr<Communicator> gpu_;
};

}  // namespace

std::unique_ptr<Communicator> make_device_routed(std::unique_ptr<Communicator> host,
                                                 GpuCommFactory make_gpu) {
  return std::make_unique<DeviceRouted>(std::move(host), std::move(make_gpu));
}

GpuCommFactory nccl_factory(int device) {
#ifdef LLMTRAIN_HAVE_NCCL
  return [device](Communicator& host_group) { return make_nccl_communicator(host_group, device); };
#else
  (void)device;
  throw Error(
      "multi-rank GPU training needs NCCL, which this build lacks (a CPU-only build, or NCCL or "
      "MPI not found when CUDA was configured); use train.device = \"cpu\"");
#endif
}

}  // namespace llmt
