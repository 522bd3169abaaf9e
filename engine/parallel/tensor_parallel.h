// Megatron 1D tensor parallelism and sequence parallelism: the communication "regions" that
// bracket the sharded layers, as forward/backward pairs (Megatron-Core mappings.py), and the
// vocab-parallel cross-entropy. The model calls these between its ops; the tp group is passed in.
//
//   region                     forward          backward
//   copy_to_region             identity         all-reduce    (before column-parallel, no SP)
//   reduce_from_region         all-reduce       identity      (after row-parallel, no SP)
//   gather_from_sequence       all-gather       reduce-scatter (before column-parallel, SP)
//   reduce_scatter_to_sequence reduce-scatter   all-gather    (after row-parallel, SP)
//
// Under SP the residual stream of a micro-batch, (B*T, C) row-major, is split into tp equal
// blocks of rows: rank r holds tokens [r*N/tp, (r+1)*N/tp) of the flattened (B, T) token axis
// (with B = 1 exactly the sequence positions [r*T/tp, (r+1)*T/tp)). Rows are the leading dim, so
// every gather and scatter moves one contiguous block per rank, as Megatron's [s, b, h] layout
// does. Identity halves have no function: the caller simply does nothing there.
#pragma once

#include <cstdint>

#include "engine/comm/communicator.h"

namespace llmt {

// The tp group a model runs in (nullptr: tp = 1) and whether SP is on.
struct TensorParallel {
  Communicator* comm = nullptr;
  bool sequence_parallel = false;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

namespace tp {

// copy_to_region backward: dx (any shape) = sum over tp of the partial input gradients.
void copy_to_region_backward(Communicator& tp, Tensor dx);
// reduce_from_region forward: x (any shape) = sum over tp of the partial outputs.
void reduce_from_region_forward(Communicator& tp, Tensor x);

// gather_from_sequence forward: full (N, C) = the ranks' shards (N/tp, C) in rank order.
void gather_from_sequence_forward(Communicator& tp, Tensor full, Tensor shard);
// gather_from_sequence backward: dshard (N/tp, C) = this rank's rows of the sum of dfull (N, C).
void gather_from_sequence_backward(Communicator& tp, Tensor dshard, Tensor dfull);
// reduce_scatter_to_sequence forward: shard (N/tp, C) = this rank's rows of the sum of full.
void reduce_scatter_to_sequence_forward(Communicator& tp, Tensor shard, Tensor full);
// reduce_scatter_to_sequence backward: dfull (N, C) = all ranks' dshard (N/tp, C) in rank order.
void reduce_scatter_to_sequence_backward(Communicator& tp, Tensor dfull, Tensor dshard);

// Distributed saved activations (Megatron's distribute-saved-activations): a tensor replicated
// over tp (without SP, a fully recomputed layer's input) kept as 1/tp of its n elements per rank,
// the flat split (n divisible by tp). split_1d: shard (n/tp) = elements [r n/tp, (r+1) n/tp) of
// full on tp rank r, no communication; gather_1d: full (any shape, n) = the ranks' shards in rank
// order (an all-gather).
void split_1d(const Communicator& tp, Tensor shard, Tensor full);
void gather_1d(Communicator& tp, Tensor full, Tensor shard);

// Vocab-parallel softmax cross-entropy (Megatron cross_entropy.py). logits (N, Vl): this rank's
// vocabulary rows [vocab_start, vocab_start + Vl) of vocab_size. losses (N) = the full loss per
// row (the same on every rank); logits are overwritten by d(dloss * loss)/d logits for this
// shard. Local max -> all-reduce(max) -> local exp-sum and owned target logit -> all-reduce(sum)
// -> finish; no rank holds more than its Vl columns. max (N) and sums (2, N) are scratch.
void vocab_parallel_cross_entropy(Communicator& tp, Tensor losses, Tensor logits, Tensor targets,
                                  int64_t vocab_start, int64_t vocab_size, float dloss, Tensor max,
                                  Tensor sums);

}  // namespace tp
}  // namespace llmt
