// `llmtrain plan --search`: every layout of a config's model at a world size — tp (within a
// node), sp, cp (with its implementation), pp (schedule, virtual stages, layers per stage), dp,
// ZeRO stage, recompute, micro-batch size — costed by predict_step; those that do not fit the
// device's memory are dropped and the rest ranked by predicted step time (ties: less memory on the
// fullest rank, then the overrides' text; the same ranking on every run) (automatic parallelism in
// the spirit of Alpa, Galvatron and Aceso, from the same cost model as `plan`).
#pragma once

#include <string>
#include <vector>

#include "plan/cost_model.h"

namespace llmt {

struct Candidate {
  std::vector<std::string> sets;  // the overrides ("parallel.tp=8", ...) that make the layout
  Config cfg;                     // the config with them applied (validated)
  StepCost cost;
};

struct SearchResult {
  std::vector<Candidate> ranked;  // fitting layouts, fastest first (at most `keep`)
  int64_t valid = 0;              // layouts the config rules accept
  int64_t fitting = 0;            // of those, layouts that fit the device's memory
};

// The global batch size and sequence length stay the config's; so do the model, optimizer and
// precision. `base` must have been parsed from `path` with `overrides` (each candidate is
// re-validated through parse_config, so every rule of a real run holds).
SearchResult search_layouts(const std::string& path, const std::vector<std::string>& overrides,
                            const Config& base, int world, const HardwareProfile& hw, size_t keep);

// A TOML fragment with a candidate's [parallel] and [train] keys, to `include`.
std::string layout_fragment(const Candidate& c, int world, const HardwareProfile& hw);

// "tp 8 sp, cp 1, pp 16 interleaved v2, dp 24, zero 1, recompute selective, mbs 1"; an uneven
// split shows its layers per stage with runs counted: "pp 16 1f1b layers [7, 8x14, 7]".
std::string layout_text(const Config& cfg, int world);

}  // namespace llmt
