// The subcommands of the llmtrain CLI, one file each. Each registers its flags on the CLI11 app
// and returns the callback that runs it; no math lives here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace llmt::app {

using Run = std::function<int()>;

Run add_train_command(CLI::App& app);
Run add_config_command(CLI::App& app);
Run add_data_command(CLI::App& app);
Run add_plan_command(CLI::App& app);

}  // namespace llmt::app
