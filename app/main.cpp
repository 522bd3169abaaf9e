// llmtrain: the command-line front end. `train` is the default subcommand: `llmtrain --config
// C.toml` is `llmtrain train --config C.toml`, as job scripts write it. Exit codes (docs/slurm.md):
// 0 success, 1 runtime failure, 2 usage or configuration error, 75 stopped early by a signal or
// train.time_limit after saving a checkpoint (resume with checkpoint.load = "auto").
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/commands.h"
#include "config/loader.h"
#include "core/allocator.h"
#include "core/check.h"
#include "engine/comm/communicator.h"

#ifndef LLMTRAIN_VERSION
#define LLMTRAIN_VERSION "0.0.0"
#endif

namespace {

std::string version_text() {
  return "llmtrain " LLMTRAIN_VERSION "\nbackends: " + llmt::built_in_backends() + "\n";
}

// argv with "train" inserted when the first argument is an option other than --help/--version
// (`llmtrain --config C.toml`).
std::vector<char*> with_default_command(int argc, char** argv) {
  static char train[] = "train";
  std::vector<char*> out(argv, argv + argc);
  if (argc > 1 && argv[1][0] == '-') {
    const std::string first = argv[1];
    if (first != "-h" && first != "--help" && first != "--version")
      out.insert(out.begin() + 1, train);
  }
  return out;
}

// The words of argv naming (sub)commands, checked against the commands `app` knows: for the first
// unknown one where a command was expected, the error line ("unknown command ...; did you mean
// ...?"), else "". CLI11 alone says only "A subcommand is required" for `llmtrain trian`.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* cur = &app;
  std::string path = "llmtrain";
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const std::vector<CLI::App*> subs = cur->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return "";  // a positional argument of a leaf command
    const std::string word = argv[i];
    CLI::App* next = nullptr;
    std::vector<std::string> names;
    for (CLI::App* sub : subs) {
      if (sub->get_name() == word) next = sub;
      names.push_back(sub->get_name());
    }
    if (!next) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      const std::optional<std::string> best = llmt::closest(word, names);
      return "unknown command '" + word + "' for " + path +
             (best ? "; did you mean '" + *best + "'?" : "") + " (commands: " + list + "; " + path +
             " --help)";
    }
    cur = next;
    path += " " + word;
  }
  return "";
}

}  // namespace

int main(int argc_in, char** argv_in) {
  // A write past a file-size limit (`ulimit -f`, a scheduler's quota) then fails with EFBIG, which
  // a save reports (exit 1 naming the cause, the previous checkpoint kept), instead of SIGXFSZ
  // ending the process without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  std::vector<char*> args = with_default_command(argc_in, argv_in);
  const int argc = static_cast<int>(args.size());
  char** argv = args.data();
  CLI::App app{
      "llmtrain: train large language models from a TOML config\n"
      "  llmtrain --config C.toml [--set k=v]...   is   llmtrain train --config C.toml ...",
      "llmtrain"};
  app.set_version_flag("--version", version_text());
  app.footer(
      "Exit codes: 0 success; 1 runtime failure (a failing rank, a non-finite loss); 2 usage or "
      "configuration error (the message names the key, file and line); 75 stopped early by "
      "SIGTERM/SIGUSR1/SIGINT or train.time_limit after saving a checkpoint (resume with "
      "checkpoint.load = \"auto\"; docs/slurm.md).\n");
  app.require_subcommand(1);
  llmt::app::Run run_train = llmt::app::add_train_command(app);
  llmt::app::Run run_config = llmt::app::add_config_command(app);
  llmt::app::Run run_data = llmt::app::add_data_command(app);
  llmt::app::Run run_checkpoint = llmt::app::add_checkpoint_command(app);
  llmt::app::Run run_plan = llmt::app::add_plan_command(app);
  llmt::app::Run run_eval = llmt::app::add_eval_command(app);
  llmt::app::Run run_generate = llmt::app::add_generate_command(app);
  if (const std::string e = unknown_command(app, argc, argv); !e.empty()) {
    std::fprintf(stderr, "error: %s\n", e.c_str());
    return 2;
  }
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
    if (app.got_subcommand("checkpoint")) return run_checkpoint();
    if (app.got_subcommand("plan")) return run_plan();
    if (app.got_subcommand("eval")) return run_eval();
    if (app.got_subcommand("generate")) return run_generate();
    return 2;
  } catch (const llmt::ConfigError& e) {
    // Every rank reads the same config and fails alike: rank 0 alone says so. The others exit a
    // moment later: mpirun tears the job down when the first rank exits non-zero, which on a
    // loaded machine can kill rank 0 before its message is out (seen in mpi_generate).
    if (llmt::world_rank_from_env() == 0)
      std::fprintf(stderr, "error: %s\n", e.what());
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
