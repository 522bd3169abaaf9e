// Runs never overwrite each other. Before a run writes anything, rank 0 looks at what
// train.run_dir and checkpoint.dir hold of an earlier run (its metrics file, its checkpoints,
// the resolved config it recorded in run_dir/config.toml) and refuses, with exit 2, to start over
// them unless the user says so (docs/configuration.md, "Run directories").
#pragma once

#include <string>

#include "train/config.h"

namespace llmt {

// The resolved config a run records in its run_dir, which the next run there compares with.
inline constexpr const char* kRunConfigFile = "config.toml";

// The identity of a run: the [model...] and, with `with_data`, the [data] sections of a resolved
// config (to_toml's text), as "section.key = value" lines.
std::string run_identity(const std::string& resolved_toml, bool with_data);

// Checks that this run may write into train.run_dir and checkpoint.dir. It may when they hold no
// metrics and no checkpoints of an earlier run. Otherwise it may:
// - when it resumes (`resuming`: checkpoint.load found a checkpoint) a run of the same model
//   ([model] equal to the recorded config's and to the newest checkpoint's; the data may change);
// - when checkpoint.load = "auto" found no checkpoint and the earlier run trained the same model
//   on the same data (a job restarted before its first checkpoint);
// - when `overwrite` (`llmtrain train --overwrite`), which deletes the earlier run's checkpoints
//   here (its metrics are truncated when the run opens them); refused when resuming.
// Throws ConfigError naming both runs, what they differ in, and the ways out.
void check_run_dirs(const Config& cfg, bool resuming, bool overwrite);

// The [model] keys in which `cfg` differs from the resolved config `other_toml` (a checkpoint's),
// except those a fine-tuning run may change: dropout, init_std, seq_len (shapes that depend on it
// are checked with the tensors) and the MoE loss coefficients and capacity factor.
// "model.d_model 128 -> 256, ..." or "" (checkpoint.init_from).
std::string finetune_model_differences(const std::string& other_toml, const Config& cfg);

// Writes to_toml(cfg) to run_dir/config.toml (rank 0, once the check passed).
void record_run_config(const Config& cfg);

}  // namespace llmt
