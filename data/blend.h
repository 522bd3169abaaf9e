// Blending ([[data.sources]]): global sample g is sample index(g) of source source(g), chosen so
// that among the first n samples every source s has count_s(n) with |count_s(n) - w_s n| <= 1
// for every n (w normalised to sum 1), and each source's samples are read in its own order.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "data/loader.h"

namespace llmt {

inline constexpr int64_t kBlendCheckpoint = 4096;  // samples between stored counts

// The assignment is earliest-deadline-first scheduling of unit jobs: source s's j-th sample
// (j = 1, 2, ...) may go at position n (1-based) only once j - 1 <= w_s n (else its count would
// run more than 1 ahead) and is due by n = j / w_s (else it would fall more than 1 behind). At
// each n the released job with the earliest deadline goes, ties to the lower source. Every
// window [(j-1)/w_s, j/w_s] has length 1/w_s and sum_s w_s = 1, so all deadlines are met,
// which is the bound above. (Megatron's helpers.cpp picks the source with the largest
// w_s n - count_s instead, which drifts past 1 with three or more sources.) The counts after
// every kBlendCheckpoint samples are kept, so any g is located by replaying < kBlendCheckpoint
// steps of O(sources) each.
class Blend final : public SampleSource {
 public:
  // weights > 0 (any scale); every source has the same window.
  Blend(std::vector<std::shared_ptr<const SampleSource>> sources, std::vector<double> weights);

  int64_t window() const override { return sources_[0]->window(); }
  void fill(int32_t* out, int64_t first, int64_t n) const override;
  // source[k], index[k] (within that source) of global samples first + k, k in [0, n).
  void assign(int64_t first, int64_t n, int32_t* source, int64_t* index) const;

  int num_sources() const { return static_cast<int>(sources_.size()); }
  std::vector<double> weights() const;  // normalised, sum 1

 private:
  // Picks the source of sample n (1-based) given the counts of samples 1..n-1.
  int pick(int64_t n, const std::vector<int64_t>& counts) const;

  std::vector<std::shared_ptr<const SampleSource>> sources_;
  // As given: with w_s = weights_[s] / total_ the tests compare products, which are exact for
  // integer weights ("weight = 3"), so ties are real ties.
  std::vector<double> weights_;
  double total_ = 0;
  mutable std::mutex mutex_;
  // checkpoints_[c * S + s] = count of source s among the first c * kBlendCheckpoint samples.
  mutable std::vector<int64_t> checkpoints_;
};

}  // namespace llmt
