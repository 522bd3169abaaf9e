// ZeRO's units laid out over a rank's model (zero.h): which parameters each unit holds, in which
// part and rows, and the elements of each buffer Zero allocates for it. Zero builds its shards and
// buffers from this; `llmtrain plan` counts ZeRO's memory and traffic from it
// (plan/cost_model.cpp), so the two cannot drift apart.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "engine/model/model_spec.h"

namespace llmt {

// A unit's parameters fall into parts by their gradient group (ModelSpec::grad_group, part k =
// GradGroup::index() k), each sharded over its own group: 0 the dp x cp group, 1 the ranks of it
// holding the same experts (expert stacks under ep), 2 those times tp (expert stacks under ep and
// tp), 3 tp x dp x cp (routed parameters under tp without ep). ModelSpec::row_group sizes them.
constexpr int kZeroParts = kNumGradGroups;
static_assert(kZeroParts == 4, "ZeroLayout::n's initialiser lists every part");

struct ZeroParam {
  size_t index = 0;  // into the spec's params
  int part = 0;
  // R (ModelSpec::cut_rows), s = ceil(R/n), this rank's real rows
  int64_t rows = 0, shard_rows = 0, own_rows = 0;
  int64_t row_numel = 0;  // elements per row
  int64_t full_off = 0;   // offset in the unit's gathered (spec-order) layout
  int64_t shard_off = 0;  // offset in the shard of the unit's part
  int64_t own_rows_of(int r) const;
};

struct ZeroUnit {
  std::vector<ZeroParam> params;                  // spec order
  int64_t full_numel = 0;                         // the gathered copy, the gradient staging
  std::array<int64_t, kZeroParts> shard_numel{};  // this rank's padded shards, by part
};

struct ZeroLayout {
  // 0: the root (the parameters of no layer: embeddings, final norm, head); l + 1: layer l
  // (global), empty when this rank does not hold it.
  std::vector<ZeroUnit> units;
  std::array<int, kZeroParts> n{1, 1, 1, 1}, rank{};  // each part's group: size, place
  std::array<bool, kZeroParts> over_tp{};             // the part's group spans tp (counted with tp)
  std::array<bool, kZeroParts> used{};  // some parameter is in the part (else n, rank are 1, 0)

  // Elements of unit u's buffers for part k: stage 3's all-gather staging and a reduce-scatter's
  // packed input (every rank's shards, rank-major), and the reduce-scatter's output (this rank's).
  int64_t all_shards(size_t u, int k) const {
    return units[u].shard_numel[static_cast<size_t>(k)] * n[static_cast<size_t>(k)];
  }
  int64_t own_shard(size_t u, int k) const { return units[u].shard_numel[static_cast<size_t>(k)]; }
};

// The layout over `spec` (a rank's: its pipeline stage, its tp shards, its experts) of
// `num_layers` global layers, for the rank at place `group_rank` of its dp x cp group of
// `group_size` ranks. Parts and their groups follow ModelSpec::grad_group and row_group.
ZeroLayout zero_layout(const ModelSpec& spec, int64_t num_layers, int group_size, int group_rank);

}  // namespace llmt
