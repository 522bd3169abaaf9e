// llmtrain eval: the loss and perplexity of a checkpoint on a split of its data, at any layout.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "app/commands.h"
#include "checkpoints/checkpoint.h"
#include "checkpoints/store.h"
#include "core/check.h"
#include "engine/comm/communicator.h"
#include "train/config.h"
#include "train/trainer.h"

namespace llmt::app {

Run add_eval_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string split = "validation";
    int64_t iters = 0;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Loss and perplexity of a checkpoint on the validation or test split of its data");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "A checkpoint, or a checkpoint.dir holding a `latest` file")
      ->required();
  cmd->add_option("--split", args->split, "validation (what training reports as val) or test")
      ->check(CLI::IsMember({"validation", "test"}));
  cmd->add_option("--iters", args->iters,
                  "Global batches to average (default: the run's train.eval_iters)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--set", args->overrides,
                  "Override a key of the run's config (its layout is reset to one rank first: "
                  "set parallel.* for mpirun; data.* for other files)");
  return [args]() {
    const std::string dir = ckpt::resolve_checkpoint_dir(args->checkpoint);
    const ckpt::Checkpoint ck(dir);
    // The run's own config, at one rank unless the user's --set say otherwise, reading the
    // checkpoint's weights (init_from) and writing nothing but a scratch run_dir.
    std::vector<std::string> sets = {"parallel.tp=1",
                                     "parallel.cp=1",
                                     "parallel.cp_impl=ring",
                                     "parallel.dp=-1",
                                     "parallel.ep=1",
                                     "parallel.sequence_parallel=false",
                                     "train.distribute_saved_activations=false"};
    sets.insert(sets.end(), no_pipeline_overrides().begin(), no_pipeline_overrides().end());
    sets.insert(sets.end(), ddp_overrides().begin(), ddp_overrides().end());
    // No update: the stored run's offload folder is not needed.
    sets.insert(sets.end(), no_offload_overrides().begin(), no_offload_overrides().end());
    sets.insert(sets.end(), args->overrides.begin(), args->overrides.end());
    char tmpl[] = "/tmp/llmtrain-eval.XXXXXX";
    const bool rank0 = world_rank_from_env() == 0;
    // A scratch run_dir: only rank 0 touches it (its lock and config.toml), so only rank 0 makes
    // one; the other ranks' copy of the name is never used.
    const std::string scratch = rank0 && mkdtemp(tmpl) ? tmpl : "/tmp/llmtrain-eval";
    for (const std::string& s :
         {"checkpoint.init_from=\"" + dir + "\"", std::string("checkpoint.load=\"none\""),
          std::string("checkpoint.dir=\"\""), std::string("checkpoint.interval=0"),
          std::string("checkpoint.keep_last=0"), std::string("train.eval_interval=1"),
          "train.run_dir=\"" + scratch + "\"", std::string("log.metrics=\"\""),
          std::string("log.tensorboard=false")})
      sets.push_back(s);
    if (args->iters > 0) sets.push_back("train.eval_iters=" + std::to_string(args->iters));
    Config cfg;
    try {
      cfg = parse_config_string(ck.state().config,
                                std::string(ckpt::kIndexFile) + " (attribute config)", sets);
    } catch (const ConfigError& e) {
      throw ConfigError("the config stored in " + dir + ": " + e.what());
    }
    CommRuntime runtime;
    std::unique_ptr<Communicator> world = make_world_communicator();
    const int world_size = world->size();
    try {
      validate_layout(cfg, world_size);
    } catch (const ConfigError& e) {
      throw ConfigError(e.what() + launch_hint(cfg, world_size));
    }
    Mesh mesh = Mesh::create(mesh_shape(cfg.parallel, world_size), std::move(world));
    TrainOptions opts;
    opts.quiet = true;
    opts.eval_test_split = args->split == "test";
    double loss = 0;
    {
      Trainer trainer(cfg, opts, mesh);
      loss = trainer.evaluate();
    }
    if (rank0) {
      std::filesystem::remove_all(scratch);
      std::printf(
          "eval: %s, %s split, %lld batches of %lld x %lld tokens, at step %lld: loss %.9g, "
          "perplexity %.6g\n",
          dir.c_str(), args->split.c_str(), static_cast<long long>(cfg.train.eval_iters),
          static_cast<long long>(cfg.train.global_batch_size),
          static_cast<long long>(cfg.model.seq_len), static_cast<long long>(ck.state().step), loss,
          std::exp(loss));
    }
    return 0;
  };
}

}  // namespace llmt::app
