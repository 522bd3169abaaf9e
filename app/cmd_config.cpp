// `llmtrain config show|validate --config F [--set k=v]...`: the resolved config, or just the
// verdict. Nothing is allocated.
#include <cstdio>

#include "app/commands.h"
#include "engine/model/model_spec.h"
#include "train/config.h"
#include "train/shrink.h"

namespace llmt::app {

Run add_config_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    int world = 0;
    bool show = false;
    bool shrink = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("config", "Show or validate a config without training");
  cmd->require_subcommand(1);
  for (const char* name : {"show", "validate"}) {
    CLI::App* sub = cmd->add_subcommand(
        name, std::string(name) == "show" ? "Print the fully resolved config (every key) as TOML"
                                          : "Check the config; exit 0 if valid, 2 otherwise");
    sub->add_option("-c,--config", args->config, "TOML config file")->required();
    sub->add_option("--set", args->overrides, "Override a key: section.key=value (repeatable)");
    sub->add_option("--world", args->world,
                    "Check the [parallel] layout against this many ranks (show: print the rank "
                    "map); MPI is not started")
        ->check(CLI::PositiveNumber);
    sub->add_flag("--shrink", args->shrink,
                  "Shrink to one machine keeping the parallel structure (docs/papers.md); "
                  "--world defaults to the shrunk world");
  }
  return [args, cmd]() {
    Shrunk shrunk;
    Config cfg = args->shrink ? parse_shrunk(args->config, args->overrides, shrunk)
                              : parse_config(args->config, args->overrides);
    if (args->shrink && args->world == 0) args->world = shrunk.world;
    if (args->world > 0) validate_layout(cfg, args->world);
    if (cmd->got_subcommand("show")) {
      if (args->shrink) {
        std::printf("# shrunk (--shrink) to world %d:", shrunk.world);
        for (const std::string& o : shrunk.overrides) std::printf(" %s", o.c_str());
        std::printf("\n");
      }
      std::printf("%s", to_toml(cfg).c_str());
      ModelSpec spec = ModelSpec::from_config(cfg.model);
      // Micro-batches per step on each dp rank: the global batch is shared over dp (1 without
      // --world, which leaves dp unknown when it is -1).
      const int64_t dp = args->world > 0 ? mesh_shape(cfg.parallel, args->world).size(Axis::dp)
                                         : std::max<int64_t>(cfg.parallel.dp, 1);
      std::printf("# parameters: %lld, gradient accumulation steps per dp rank: %lld (dp %lld%s)\n",
                  static_cast<long long>(spec.num_params()),
                  static_cast<long long>(grad_accum_steps(cfg) / dp), static_cast<long long>(dp),
                  args->world > 0 || cfg.parallel.dp > 0
                      ? ""
                      : "; dp = -1 is counted as 1 without --world");
      if (args->world > 0) {
        const MeshShape shape = mesh_shape(cfg.parallel, args->world);
        std::printf("# mesh for world size %d: tp %d, cp %d, dp %d, pp %d (tp fastest)\n",
                    args->world, shape.size(Axis::tp), shape.size(Axis::cp), shape.size(Axis::dp),
                    shape.size(Axis::pp));
        std::printf("%s", rank_map(shape).c_str());
      }
    } else {
      std::printf("%s: valid\n", args->config.c_str());
    }
    return 0;
  };
}

}  // namespace llmt::app
