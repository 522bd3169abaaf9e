// The subcommands of the llmtrain CLI, one file each. Each registers its flags on the CLI11 app
// and returns the callback that runs it; no math lives here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace llmt {
struct Config;
struct ModelSpec;
}  // namespace llmt

namespace llmt::app {

using Run = std::function<int()>;

Run add_train_command(CLI::App& app);
Run add_config_command(CLI::App& app);
Run add_data_command(CLI::App& app);
Run add_checkpoint_command(CLI::App& app);
Run add_plan_command(CLI::App& app);
Run add_eval_command(CLI::App& app);
Run add_generate_command(CLI::App& app);

// "; this layout needs N ranks: run it under `mpirun -np N llmtrain ...` ..." when the config's
// layout needs more ranks than `world`, else "" (train and eval append it to layout errors).
std::string launch_hint(const Config& cfg, int world);

// The parameter count as the start-up line and plan print it: the model's without its
// multi-token prediction modules (as the papers count them), then " (A active: k of E experts per
// MoE layer)" for a mixture of experts and " (+ M in D multi-token prediction modules)" with MTP.
std::string params_text(const ModelSpec& spec);

}  // namespace llmt::app
