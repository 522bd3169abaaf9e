// llmtrain: the command-line front end. Exit codes: 0 success, 2 usage or configuration error,
// 1 runtime failure.
#include <cstdio>
#include <exception>
#include <string>

#include "app/commands.h"
#include "engine/core/allocator.h"
#include "engine/core/check.h"

#ifndef LLMTRAIN_VERSION
#define LLMTRAIN_VERSION "0.0.0"
#endif

namespace {

std::string version_text() {
  std::string s = "llmtrain " LLMTRAIN_VERSION "\nbackends: cpu (OpenMP + BLAS)";
  s += llmt::cuda_built_in() ? ", cuda (device memory only; kernels not built yet)" : "";
  s += "\n";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"llmtrain: train large language models from a TOML config", "llmtrain"};
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1);
  llmt::app::Run run_train = llmt::app::add_train_command(app);
  llmt::app::Run run_config = llmt::app::add_config_command(app);
  llmt::app::Run run_data = llmt::app::add_data_command(app);
  llmt::app::Run run_plan = llmt::app::add_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (app.got_subcommand("train")) return run_train();
    if (app.got_subcommand("config")) return run_config();
    if (app.got_subcommand("data")) return run_data();
    if (app.got_subcommand("plan")) return run_plan();
    return 2;
  } catch (const llmt::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
