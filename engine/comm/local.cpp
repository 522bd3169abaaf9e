// A group of one rank: all-reduce and broadcast leave the data as it is, reduce-scatter,
// all-gather and all-to-all are copies, point-to-point has no peer. Counts calls (0 bytes). And
// a group's shape only (rank and size, no collective; under ops::Recording collectives that do
// nothing), for models built to count their buffers and their ops' bytes.
#include "engine/comm/communicator.h"
#include "kernels/ops.h"

namespace llmt {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  Handle all_reduce(Tensor x, ReduceOp) override {
    count(CommKind::all_reduce, 0);
    (void)x;
    return {};
  }
  Handle reduce_scatter(Tensor out, Tensor in) override {
    return copy(CommKind::reduce_scatter, out, in);
  }
  Handle all_gather(Tensor out, Tensor in) override { return copy(CommKind::all_gather, out, in); }
  Handle broadcast(Tensor x, int root) override {
    LLMT_CHECK(root == 0, "broadcast root ", root, " in a group of one (", name_, ")");
    (void)x;
    count(CommKind::broadcast, 0);
    return {};
  }
  Handle all_to_all(Tensor out, Tensor in) override { return copy(CommKind::all_to_all, out, in); }
  Handle all_to_allv(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                     std::span<const int64_t> in_counts) override {
    LLMT_CHECK(out_counts.size() == 1 && in_counts.size() == 1 && out_counts[0] == in_counts[0] &&
                   in_counts[0] <= in.numel() && in_counts[0] <= out.numel(),
               name_, " all_to_allv in a group of one: send and receive counts differ");
    const int64_t n = in_counts[0];
    return copy(CommKind::all_to_all, Tensor(out.data, {n}, out.dtype, out.device),
                Tensor(in.data, {n}, in.dtype, in.device));
  }
  Handle send(Tensor, int peer, int) override {
    throw Error(detail::concat("send to rank ", peer, " in a group of one (", name_, ")"));
  }
  Handle recv(Tensor, int peer, int) override {
    throw Error(detail::concat("recv from rank ", peer, " in a group of one (", name_, ")"));
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_unique<LocalCommunicator>(name);
  }

 private:
  Handle copy(CommKind k, Tensor out, Tensor in) {
    LLMT_CHECK(out.numel() == in.numel() && out.dtype == in.dtype, name_, " ", comm_kind_name(k),
               ": out ", describe(out), " and in ", describe(in), " differ in a group of one");
    if (out.data != in.data) ops::copy(out.view(in.shape), in);
    count(k, 0);
    return {};
  }
  std::string name_;
};

class ShapeCommunicator final : public Communicator {
 public:
  ShapeCommunicator(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)) {}
  int rank() const override { return known().rank_; }
  int size() const override { return known().size_; }
  const std::string& name() const override { return name_; }
  Handle all_reduce(Tensor, ReduceOp) override { return refuse("all_reduce"); }
  Handle reduce_scatter(Tensor, Tensor) override { return refuse("reduce_scatter"); }
  Handle all_gather(Tensor, Tensor) override { return refuse("all_gather"); }
  Handle broadcast(Tensor, int) override { return refuse("broadcast"); }
  Handle all_to_all(Tensor, Tensor) override { return refuse("all_to_all"); }
  Handle all_to_allv(Tensor, std::span<const int64_t>, Tensor, std::span<const int64_t>) override {
    return refuse("all_to_allv");
  }
  Handle send(Tensor, int, int) override { return refuse("send"); }
  Handle recv(Tensor, int, int) override { return refuse("recv"); }
  void barrier() override { refuse("barrier"); }
  // A split group's shape depends on every member's color, which one rank does not know: it
  // exists (a model may hold it) but its rank and size are errors.
  std::unique_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_unique<ShapeCommunicator>(-1, -1, name_ + "/" + name);
  }

 private:
  const ShapeCommunicator& known() const {
    if (size_ < 0)
      throw Error(detail::concat(name_, ": a group split from a group's shape has no known shape"));
    return *this;
  }
  Handle refuse(const char* what) const {
    // A model running a step for plan's op count (ops::Recording): its collectives complete
    // at once and move nothing (the cost model counts their bytes from the layout).
    if (ops::Recording::active()) return {};
    throw Error(detail::concat(what, " on ", name_, ", a group's shape only (rank ", rank_, " of ",
                               size_, "): a model built for counting runs no collective"));
  }
  int rank_, size_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_shape_communicator(int rank, int size, const std::string& name) {
  LLMT_CHECK(size >= 1 && rank >= 0 && rank < size, "group shape: rank ", rank, " of ", size);
  return std::make_unique<ShapeCommunicator>(rank, size, name);
}

std::unique_ptr<Communicator> make_local_communicator(const std::string& name) {
  return std::make_unique<LocalCommunicator>(name);
}

}  // namespace llmt
