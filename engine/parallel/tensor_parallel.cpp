// The tp regions and vocab-parallel cross-entropy over a Communicator (tensor_parallel.h). Each
// collective is waited on at once, by the device: the model's next op, a kernel on the compute
// stream, reads its result, and the caller owns the buffers (Handle::device_wait).
#include "engine/parallel/tensor_parallel.h"

#include "kernels/ops.h"

namespace llmt::tp {
namespace {

// full (N, C) and shard (N/p, C) over a group of p.
void check_rows(const char* what, const Communicator& tp, const Tensor& full, const Tensor& shard) {
  LLMT_CHECK(full.ndim() >= 1 && shard.ndim() >= 1 && full.numel() == shard.numel() * tp.size() &&
                 full.shape[0] == shard.shape[0] * tp.size(),
             what, ": full ", describe(full), " must be ", tp.size(), " shards ", describe(shard),
             " stacked along dim 0 (tp=", tp.size(), ")");
}

// full (n elements, any shape) and shard (n/p) over a group of p.
void check_1d(const char* what, const Communicator& tp, const Tensor& full, const Tensor& shard) {
  LLMT_CHECK(
      shard.ndim() == 1 && full.numel() == shard.numel() * tp.size() && full.dtype == shard.dtype,
      what, ": full ", describe(full), " must be ", tp.size(), " flat shards ", describe(shard),
      " of its type (tp=", tp.size(), ")");
}

}  // namespace

void split_1d(const Communicator& tp, Tensor shard, Tensor full) {
  check_1d("split_1d", tp, full, shard);
  const int64_t n = shard.numel(), r = tp.rank();
  ops::copy(shard, full.view({full.numel()}).rows(r * n, (r + 1) * n));
}

void gather_1d(Communicator& tp, Tensor full, Tensor shard) {
  check_1d("gather_1d", tp, full, shard);
  tp.all_gather(full.view({full.numel()}), shard).device_wait();
}

void copy_to_region_backward(Communicator& tp, Tensor dx) {
  tp.all_reduce(dx).device_wait();
}

void reduce_from_region_forward(Communicator& tp, Tensor x) {
  tp.all_reduce(x).device_wait();
}

void gather_from_sequence_forward(Communicator& tp, Tensor full, Tensor shard) {
  check_rows("gather_from_sequence_forward", tp, full, shard);
  tp.all_gather(full, shard).device_wait();
}

void gather_from_sequence_backward(Communicator& tp, Tensor dshard, Tensor dfull) {
  check_rows("gather_from_sequence_backward", tp, dfull, dshard);
  tp.reduce_scatter(dshard, dfull).device_wait();
}

void reduce_scatter_to_sequence_forward(Communicator& tp, Tensor shard, Tensor full) {
  check_rows("reduce_scatter_to_sequence_forward", tp, full, shard);
  tp.reduce_scatter(shard, full).device_wait();
}

void reduce_scatter_to_sequence_backward(Communicator& tp, Tensor dfull, Tensor dshard) {
  check_rows("reduce_scatter_to_sequence_backward", tp, dfull, dshard);
  tp.all_gather(dfull, dshard).device_wait();
}

void vocab_parallel_cross_entropy(Communicator& tp, Tensor losses, Tensor logits, Tensor targets,
                                  int64_t vocab_start, int64_t vocab_size, float dloss, Tensor max,
                                  Tensor sums) {
  ops::cross_entropy_shard_max(max, logits, targets, vocab_size);
  tp.all_reduce(max, ReduceOp::max).device_wait();
  ops::cross_entropy_shard_sums(sums, logits, max, targets, vocab_start);
  tp.all_reduce(sums).device_wait();
  ops::cross_entropy_shard_finish(losses, logits, logits, max, sums, targets, vocab_start, dloss);
}

}  // namespace llmt::tp
