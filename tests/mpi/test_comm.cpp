// Communicator tests with exact per-rank answers, run under mpirun on 1, 2, 3 and 4 ranks (and
// on the local backend without a launcher): every collective, point-to-point on a ring, split,
// and the byte counters' ring volumes; the device-routed group with a stand-in for NCCL.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/comm/communicator.h"
#include "tests/mpi/mpi_test_main.h"

namespace llmt {
namespace {

Tensor f32(std::vector<float>& v) {
  return Tensor(v.data(), {static_cast<int64_t>(v.size())}, DType::f32);
}

TEST(Comm, AllReduceSum) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank();
  std::vector<float> x(5);
  for (int i = 0; i < 5; ++i) x[i] = static_cast<float>(r * 10 + i);
  c.all_reduce(f32(x)).wait();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(x[i], 10.0f * p * (p - 1) / 2 + p * i) << "rank " << r;
}

// Sums of squares are reduced in double: a value fp32 cannot hold (2^30 + r) sums exactly.
TEST(Comm, AllReduceDouble) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank();
  double x[2] = {1073741824.0 + r, 0.5 * r};
  c.all_reduce(Tensor(x, {2}, DType::f64)).wait();
  EXPECT_EQ(x[0], 1073741824.0 * p + p * (p - 1) / 2) << "rank " << r;
  EXPECT_EQ(x[1], 0.25 * p * (p - 1)) << "rank " << r;
}

TEST(Comm, AllReduceMaxAndInt) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank();
  std::vector<float> x(4);
  for (int i = 0; i < 4; ++i) x[i] = static_cast<float>((r + 1) * (i % 2 ? -1 : 1) * (i + 1));
  c.all_reduce(f32(x), ReduceOp::max).wait();
  EXPECT_EQ(x[0], static_cast<float>(p));
  EXPECT_EQ(x[1], -2.0f);  // max of -(r+1)*2 is rank 0's
  EXPECT_EQ(x[2], 3.0f * p);
  int32_t n = r + 1;
  c.all_reduce(Tensor(&n, {1}, DType::i32)).wait();
  EXPECT_EQ(n, p * (p + 1) / 2);
}

TEST(Comm, ReduceScatter) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank(), n = 3;
  std::vector<float> in(static_cast<size_t>(p * n)), out(n, -1.0f);
  for (int j = 0; j < p * n; ++j) in[j] = static_cast<float>(r + j);
  c.reduce_scatter(f32(out), f32(in)).wait();
  for (int k = 0; k < n; ++k)
    EXPECT_EQ(out[k], p * (p - 1) / 2.0f + p * (r * n + k)) << "rank " << r;
}

TEST(Comm, AllGather) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank(), n = 2;
  std::vector<float> in(n), out(static_cast<size_t>(p * n), -1.0f);
  for (int k = 0; k < n; ++k) in[k] = static_cast<float>(r * 100 + k);
  c.all_gather(f32(out), f32(in)).wait();
  for (int q = 0; q < p; ++q)
    for (int k = 0; k < n; ++k) EXPECT_EQ(out[q * n + k], q * 100.0f + k);
}

TEST(Comm, Broadcast) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank(), root = p - 1;
  std::vector<float> x(3);
  for (int k = 0; k < 3; ++k) x[k] = static_cast<float>(r * 7 + k);
  c.broadcast(f32(x), root).wait();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(x[k], root * 7.0f + k);
}

TEST(Comm, AllToAll) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank(), n = 2;
  std::vector<float> in(static_cast<size_t>(p * n)), out(in.size(), -1.0f);
  for (int q = 0; q < p; ++q)
    for (int k = 0; k < n; ++k) in[q * n + k] = static_cast<float>(r * 1000 + q * 10 + k);
  c.all_to_all(f32(out), f32(in)).wait();
  for (int q = 0; q < p; ++q)
    for (int k = 0; k < n; ++k) EXPECT_EQ(out[q * n + k], q * 1000.0f + r * 10 + k);
}

// Blocks of different sizes: rank r sends q + r + 1 elements to rank q (so every pair differs),
// valued r * 1000 + q * 10 + k; the counters hold the bytes sent to the others.
TEST(Comm, AllToAllV) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank();
  std::vector<int64_t> in_counts(p), out_counts(p);
  std::vector<float> in;
  for (int q = 0; q < p; ++q) {
    in_counts[q] = q + r + 1;
    out_counts[q] = r + q + 1;
    for (int k = 0; k < q + r + 1; ++k) in.push_back(static_cast<float>(r * 1000 + q * 10 + k));
  }
  std::vector<float> out(
      static_cast<size_t>(std::accumulate(out_counts.begin(), out_counts.end(), int64_t{0})) + 3,
      -1.0f);
  c.reset_counters();
  c.all_to_allv(f32(out), out_counts, f32(in), in_counts).wait();
  size_t at = 0;
  for (int q = 0; q < p; ++q)
    for (int k = 0; k < r + q + 1; ++k) EXPECT_EQ(out[at++], q * 1000.0f + r * 10 + k);
  EXPECT_EQ(out[at], -1.0f);  // past the received elements: untouched
  int64_t sent = 0;
  for (int q = 0; q < p; ++q) sent += q == r ? 0 : in_counts[q] * 4;
  EXPECT_EQ(c.counters().bytes[static_cast<int>(CommKind::all_to_all)], sent);
}

TEST(Comm, SendRecvRing) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank();
  if (p == 1) GTEST_SKIP() << "no peer in a group of one";
  std::vector<float> out{static_cast<float>(r), static_cast<float>(r * r)}, in(2, -1.0f);
  Handle rh = c.recv(f32(in), (r + p - 1) % p, 5);
  Handle sh = c.send(f32(out), (r + 1) % p, 5);
  rh.wait();
  sh.wait();
  const int from = (r + p - 1) % p;
  EXPECT_EQ(in[0], static_cast<float>(from));
  EXPECT_EQ(in[1], static_cast<float>(from * from));
}

TEST(Comm, Split) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank();
  // Even and odd ranks, ordered by descending rank.
  std::unique_ptr<Communicator> sub = c.split(r % 2, -r, "parity");
  const int expected_size = r % 2 ? p / 2 : (p + 1) / 2;
  EXPECT_EQ(sub->size(), expected_size);
  EXPECT_EQ(sub->name(), "parity");
  int32_t v = r;
  sub->all_reduce(Tensor(&v, {1}, DType::i32)).wait();
  int32_t expect = 0;
  for (int q = r % 2; q < p; q += 2) expect += q;
  EXPECT_EQ(v, expect);
  // Highest rank of the parity class has sub-rank 0.
  int top = r % 2;
  while (top + 2 < p) top += 2;
  EXPECT_EQ(sub->rank(), (top - r) / 2);
}

TEST(Comm, Counters) {
  Communicator& c = mpi_test_world();
  const int64_t p = c.size();
  c.reset_counters();
  std::vector<float> x(12, 1.0f), big(static_cast<size_t>(12 * p));
  c.all_reduce(f32(x)).wait();
  c.all_gather(f32(big), f32(x)).wait();
  c.reduce_scatter(f32(x), f32(big)).wait();
  c.all_reduce(f32(x)).wait();
  const CommCounters& k = c.counters();
  EXPECT_EQ(k.calls[static_cast<int>(CommKind::all_reduce)], 2);
  EXPECT_EQ(k.bytes[static_cast<int>(CommKind::all_reduce)], 2 * (2 * (p - 1) * 48 / p));
  EXPECT_EQ(k.bytes[static_cast<int>(CommKind::all_gather)], (p - 1) * 48);
  EXPECT_EQ(k.bytes[static_cast<int>(CommKind::reduce_scatter)], (p - 1) * 48);
  EXPECT_EQ(k.calls[static_cast<int>(CommKind::broadcast)], 0);
  c.reset_counters();
  EXPECT_EQ(c.counters().bytes[static_cast<int>(CommKind::all_reduce)], 0);
}

TEST(Comm, ManyInFlight) {
  // Several non-blocking collectives outstanding at once, completed in reverse order.
  Communicator& c = mpi_test_world();
  const int p = c.size();
  std::vector<std::vector<float>> xs(6, std::vector<float>(1000));
  std::vector<Handle> hs;
  for (size_t j = 0; j < xs.size(); ++j) {
    std::fill(xs[j].begin(), xs[j].end(), static_cast<float>(j + c.rank()));
    hs.push_back(c.all_reduce(f32(xs[j])));
  }
  for (size_t j = xs.size(); j-- > 0;) {
    while (!hs[j].poll()) {
    }
    EXPECT_TRUE(hs[j].done());
    EXPECT_EQ(xs[j][999], static_cast<float>(p * j + p * (p - 1) / 2));
  }
}

// A stand-in for NCCL: forwards to a host communicator, taking tensors labelled as CUDA (whose
// memory is host memory here) as host tensors. Like NCCL it ignores tags apart from their p2p
// channel: the host tag is the channel, so messages of a channel match in issue order.
class FakeGpu final : public Communicator {
 public:
  explicit FakeGpu(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Handle all_reduce(Tensor x, ReduceOp op) override { return inner_->all_reduce(host(x), op); }
  Handle reduce_scatter(Tensor o, Tensor i) override {
    return inner_->reduce_scatter(host(o), host(i));
  }
  Handle all_gather(Tensor o, Tensor i) override { return inner_->all_gather(host(o), host(i)); }
  Handle broadcast(Tensor x, int root) override { return inner_->broadcast(host(x), root); }
  Handle all_to_all(Tensor o, Tensor i) override { return inner_->all_to_all(host(o), host(i)); }
  Handle all_to_allv(Tensor o, std::span<const int64_t> oc, Tensor i,
                     std::span<const int64_t> ic) override {
    return inner_->all_to_allv(host(o), oc, host(i), ic);
  }
  Handle send(Tensor x, int peer, int tag) override {
    return inner_->send(host(x), peer, p2p_channel(tag, channels));
  }
  Handle recv(Tensor x, int peer, int tag) override {
    return inner_->recv(host(x), peer, p2p_channel(tag, channels));
  }
  void open_p2p_channels(int n) override { channels = n; }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { return nullptr; }
  CommCounters counters() const override { return inner_->counters(); }
  int channels = 1;

 private:
  static Tensor host(Tensor t) {
    EXPECT_EQ(t.device.kind, DeviceKind::cuda) << "a host tensor was routed to the GPU group";
    t.device = Device{DeviceKind::cpu, 0};
    return t;
  }
  std::unique_ptr<Communicator> inner_;
};

// make_device_routed sends CUDA tensors to the group's GPU communicator and host tensors to the
// host one, and builds a GPU communicator for every group split off it.
TEST(Comm, DeviceRouted) {
  Communicator& c = mpi_test_world();
  const int p = c.size(), r = c.rank();
  std::vector<FakeGpu*> gpus;
  auto routed = make_device_routed(c.split(0, r, "world2"), [&](Communicator& host_group) {
    auto g = std::make_unique<FakeGpu>(host_group.split(0, host_group.rank(), "gpu"));
    gpus.push_back(g.get());
    return g;
  });
  ASSERT_EQ(gpus.size(), 1u);
  std::vector<float> a(3, 1.0f), b(3, 2.0f);
  Tensor on_gpu(b.data(), {3}, DType::f32, Device{DeviceKind::cuda, 0});
  routed->all_reduce(f32(a)).wait();
  routed->all_reduce(on_gpu).wait();
  EXPECT_EQ(a[0], static_cast<float>(p));
  EXPECT_EQ(b[0], 2.0f * p);
  const int ar = static_cast<int>(CommKind::all_reduce);
  EXPECT_EQ(gpus[0]->counters().calls[ar], 1);  // only the CUDA tensor went to the GPU group
  EXPECT_EQ(routed->counters().calls[ar], 2);   // the group reports both
  std::vector<float> gathered(static_cast<size_t>(p));
  float mine = static_cast<float>(r);
  EXPECT_THROW(routed->all_gather(Tensor(gathered.data(), {p}, DType::f32),
                                  Tensor(&mine, {1}, DType::f32, Device{DeviceKind::cuda, 0})),
               Error);  // mixed devices in one call
  auto sub = routed->split(r % 2, r, "parity");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(sub->size(), gpus[1]->size());
  float x = 1.0f;
  sub->all_reduce(Tensor(&x, {1}, DType::f32, Device{DeviceKind::cuda, 0})).wait();
  EXPECT_EQ(x, static_cast<float>(sub->size()));
  EXPECT_EQ(gpus[1]->counters().calls[ar], 1);
}

// open_p2p_channels reaches the group's GPU communicator, and its channels keep separate orders:
// rank 0 sends tags 0, 1, 2 (channels 0, 1, 0 of 2) to rank 1, which receives tag 1 first.
TEST(Comm, DeviceRoutedP2pChannels) {
  Communicator& c = mpi_test_world();
  const int r = c.rank();
  FakeGpu* gpu = nullptr;
  auto routed = make_device_routed(c.split(0, r, "world2"), [&](Communicator& host_group) {
    auto g = std::make_unique<FakeGpu>(host_group.split(0, host_group.rank(), "gpu"));
    gpu = g.get();
    return g;
  });
  routed->open_p2p_channels(2);
  EXPECT_EQ(gpu->channels, 2);
  if (c.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const Device cuda{DeviceKind::cuda, 0};
  float m[3] = {10.0f, 11.0f, 12.0f};
  if (r == 0) {
    std::vector<Handle> sent;
    for (int tag = 0; tag < 3; ++tag)
      sent.push_back(routed->send(Tensor(&m[tag], {1}, DType::f32, cuda), 1, tag));
    for (Handle& h : sent) h.wait();
  } else if (r == 1) {
    float got[3] = {-1.0f, -1.0f, -1.0f};
    Handle h1 = routed->recv(Tensor(&got[1], {1}, DType::f32, cuda), 0, 1);
    Handle h0 = routed->recv(Tensor(&got[0], {1}, DType::f32, cuda), 0, 0);
    Handle h2 = routed->recv(Tensor(&got[2], {1}, DType::f32, cuda), 0, 2);
    h1.device_wait();  // MPI: waits on the host
    h0.wait();
    h2.wait();
    for (int k = 0; k < 3; ++k) EXPECT_EQ(got[k], m[k]) << "tag " << k;
  }
}

}  // namespace
}  // namespace llmt
