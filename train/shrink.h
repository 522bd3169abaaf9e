// `--shrink`: a published setup (configs/papers) made small enough to run on one machine with its
// parallel structure intact, so that a laptop under mpirun exercises the same code paths as the
// cluster run (docs/papers.md). Kept: the architecture and its switches, MHA vs GQA, tp and sp,
// cp and its implementation, pp with its schedule and virtual stages, ZeRO stage, recompute,
// precision and the optimizer's kind. Shrunk: every degree to at most 2 (world <= 8), the model
// to 4 layers of width 64 with 8 heads (4 kv heads under GQA) over 64 positions and 256 tokens,
// the batch to 2 micro-batches per dp rank (2 per pp rank for interleaved), 4 steps; uneven
// pp_layers become even, and hybrid context parallelism (which needs cp > 2) a ring. The shrunk
// config run at one rank (its [parallel] reset) is the reference of the same config run at its
// shrunk world.
#pragma once

#include <string>
#include <vector>

#include "train/config.h"

namespace llmt {

struct Shrunk {
  std::vector<std::string> overrides;  // "section.key=value", applied after the config's own
  int world = 1;                       // the ranks the shrunk layout needs
};
Shrunk shrink_overrides(const Config& c);

// `--shrink` of the config at `path` with the user's `overrides`: the shrink is computed from the
// config with those overrides (or from the file alone when they do not validate before shrinking,
// e.g. --set train.steps=6 under a paper's 2000 warmup steps), then the user's overrides apply
// after the shrink's, so that they win (--shrink --set train.steps=6 trains 6 steps). Sets
// `shrunk` to what was applied.
Config parse_shrunk(const std::string& path, const std::vector<std::string>& overrides,
                    Shrunk& shrunk);

}  // namespace llmt
