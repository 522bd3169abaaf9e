// `llmtrain train --config F [--set k=v]...`: parse, validate, train.
#include <cstdio>

#include "app/commands.h"
#include "engine/model/model_spec.h"
#include "engine/train/config.h"
#include "engine/train/trainer.h"

namespace llmt::app {

Run add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string dump_dir;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("-c,--config", args->config, "TOML config file")->required();
  cmd->add_option("--set", args->overrides, "Override a key: section.key=value (repeatable)");
  cmd->add_option("--dump-dir", args->dump_dir,
                  "Write the initial weights and every step's tokens here (docs/model.md)");
  cmd->add_flag("-q,--quiet", args->quiet, "No progress lines");
  return [args]() {
    Config cfg = parse_config(args->config, args->overrides);
    ModelSpec spec = ModelSpec::from_config(cfg.model);
    if (!args->quiet)
      std::printf("llmtrain: %s, %lld parameters, %lld layers, d_model %lld, seq_len %lld, %s\n",
                  cfg.model.arch == Arch::gpt2 ? "gpt2" : "llama",
                  static_cast<long long>(spec.num_params()),
                  static_cast<long long>(cfg.model.n_layers),
                  static_cast<long long>(cfg.model.d_model),
                  static_cast<long long>(cfg.model.seq_len),
                  std::string(precision_name(cfg.train.precision)).c_str());
    TrainOptions opts{args->dump_dir, args->quiet};
    TrainResult r = train(cfg, opts);
    if (!args->quiet)
      std::printf("done: %lld steps, final loss %.4f, metrics in %s\n",
                  static_cast<long long>(r.steps), r.final_loss, cfg.train.run_dir.c_str());
    return 0;
  };
}

}  // namespace llmt::app
