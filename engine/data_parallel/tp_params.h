// What the data-parallel strategies and the trainer need to know about parameters sharded over
// tp (and expert stacks split over ep): which elements count in the global gradient norm, and how
// every tp rank's shards become the global tensors again (debug dumps, parity tests). Above the
// model: it reads the ModelSpec.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/model/model_spec.h"

namespace llmt {

// Whether this rank's copy of parameter i counts in a norm summed over the tp group: a sharded
// parameter's elements are each on one rank; a replicated one (the same on every tp rank)
// counts on tp rank 0 only. The last pipeline stage's tied copy of wte counts on stage 0 only.
inline bool counts_in_tp_norm(const ModelSpec& spec, size_t i) {
  return !spec.params[i].tied_copy && (spec.params[i].on(Axis::tp).sharded() || spec.tp_rank == 0);
}

// Sum of squares of `flat`, elements [begin, begin + flat.numel()) of a buffer holding the
// parameters (or gradients) of `spec` back to back at this rank's shapes, skipping what
// counts_in_tp_norm excludes. Summed over tp (and over dp for ZeRO's shards), it is the squared
// global norm.
double tp_sum_squares(const ModelSpec& spec, Tensor flat, int64_t begin = 0);

// Every tp rank's parameters (host f32, spec order, this rank's shapes) -> the global tensors
// (host f32, spec order, global shapes), on every rank of the tp group: one all-gather. Throws if
// a replicated parameter is not bitwise the same on every tp rank.
void gather_tp_params(Communicator& tp, const ModelSpec& spec, const std::vector<float>& local,
                      std::vector<float>& global);

// Expert parallelism (tp = 1): every ep rank's parameters (host f32, spec order, this rank's
// shapes: its E/ep experts of each expert stack) -> the same with whole expert stacks (E, ...),
// the ranks' experts in ep rank order, on every rank of the ep group: one all-gather. Throws if
// a parameter other than an expert stack is not bitwise the same on every ep rank.
void gather_ep_params(Communicator& ep, const ModelSpec& spec, const std::vector<float>& local,
                      std::vector<float>& global);

}  // namespace llmt
