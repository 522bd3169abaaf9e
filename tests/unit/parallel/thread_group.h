// A tp group simulated in one process: p threads, one per rank, each with a ThreadCommunicator
// over shared memory. Collectives reduce in rank order into a private copy and every rank takes
// the same result, so ranks stay bit-identical, as Open MPI's all-reduce keeps them. Only the
// collectives the tensor-parallel model uses are implemented; the rest throw.
#pragma once

#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/comm/communicator.h"

namespace llmt::test {

struct ThreadGroupState {
  explicit ThreadGroupState(int p) : size(p), sync(p), slots(p) {}
  int size;
  std::barrier<> sync;
  std::vector<const float*> slots;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroupState> state, int rank)
      : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const std::string& name() const override { return name_; }

  Handle all_reduce(Tensor x, ReduceOp op) override {
    const int64_t n = x.numel();
    post(x);
    std::vector<float> acc(state_->slots[0], state_->slots[0] + n);
    for (int r = 1; r < size(); ++r)
      for (int64_t i = 0; i < n; ++i)
        acc[i] = op == ReduceOp::sum ? acc[i] + state_->slots[r][i]
                                     : std::max(acc[i], state_->slots[r][i]);
    state_->sync.arrive_and_wait();  // everyone has read every slot
    std::copy(acc.begin(), acc.end(), x.f32());
    count(CommKind::all_reduce, x.nbytes());
    return {};
  }
  Handle reduce_scatter(Tensor out, Tensor in) override {
    const int64_t n = out.numel();
    LLMT_CHECK(in.numel() == n * size(), "reduce_scatter sizes");
    post(in);
    std::vector<float> acc(state_->slots[0] + rank_ * n, state_->slots[0] + (rank_ + 1) * n);
    for (int r = 1; r < size(); ++r)
      for (int64_t i = 0; i < n; ++i) acc[i] += state_->slots[r][rank_ * n + i];
    state_->sync.arrive_and_wait();
    std::copy(acc.begin(), acc.end(), out.f32());
    count(CommKind::reduce_scatter, in.nbytes());
    return {};
  }
  Handle all_gather(Tensor out, Tensor in) override {
    const int64_t n = in.numel();
    LLMT_CHECK(out.numel() == n * size(), "all_gather sizes");
    post(in);
    std::vector<float> acc(static_cast<size_t>(n * size()));
    for (int r = 0; r < size(); ++r)
      std::copy(state_->slots[r], state_->slots[r] + n, acc.begin() + r * n);
    state_->sync.arrive_and_wait();
    std::copy(acc.begin(), acc.end(), out.f32());
    count(CommKind::all_gather, out.nbytes());
    return {};
  }
  Handle broadcast(Tensor, int) override { throw Error("ThreadCommunicator: no broadcast"); }
  Handle all_to_all(Tensor, Tensor) override { throw Error("ThreadCommunicator: no all_to_all"); }
  Handle all_to_allv(Tensor, std::span<const int64_t>, Tensor, std::span<const int64_t>) override {
    throw Error("ThreadCommunicator: no all_to_allv");
  }
  Handle send(Tensor, int, int) override { throw Error("ThreadCommunicator: no send"); }
  Handle recv(Tensor, int, int) override { throw Error("ThreadCommunicator: no recv"); }
  void barrier() override { state_->sync.arrive_and_wait(); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override {
    throw Error("ThreadCommunicator: no split");
  }

 private:
  void post(const Tensor& x) {
    LLMT_CHECK(x.dtype == DType::f32, "ThreadCommunicator: f32 only");
    state_->slots[rank_] = x.f32();
    state_->sync.arrive_and_wait();  // every rank has posted
  }
  std::shared_ptr<ThreadGroupState> state_;
  int rank_;
  std::string name_ = "tp";
};

// Runs body(comm) on p threads, one rank each, and rethrows the first exception.
inline void run_ranks(int p, const std::function<void(Communicator&)>& body) {
  auto state = std::make_shared<ThreadGroupState>(p);
  std::vector<std::exception_ptr> errors(p);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(state, r);
      try {
        body(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace llmt::test
