// `llmtrain checkpoint inspect|verify|reshard|export|import DIR ...`: the offline checkpoint tools
// (docs/checkpoint-format.md). DIR is a checkpoint directory, or a directory of checkpoints with a
// `latest` file. Nothing here starts MPI.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/commands.h"
#include "checkpoints/checkpoint.h"
#include "checkpoints/export.h"
#include "checkpoints/import.h"
#include "checkpoints/tools.h"
#include "data/tokenizer.h"
#include "engine/model/model_spec.h"
#include "train/config.h"
#include "train/memory_estimate.h"

namespace llmt::app {

namespace {

ckpt::Checkpoint open_checkpoint(const std::string& dir) {
  return ckpt::Checkpoint(ckpt::resolve_checkpoint_dir(dir));
}

// The config stored in the checkpoint, with `overrides` applied. Only [model] and [parallel]
// matter here: the data files the run read need not exist on this machine. Its data paths were
// resolved when the run started (relative ones to the run's working directory), so they are kept
// as written: the name given to the parser has no folder to resolve them against (a name with
// the checkpoint's folder made data.tokenizer relative to it, and export found no tokenizer).
Config stored_config(const ckpt::Checkpoint& ck, std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "data.source=\"synthetic\"");
  Config cfg;
  try {
    cfg = parse_config_string(ck.state().config,
                              std::string(ckpt::kIndexFile) + " (attribute config)", overrides);
  } catch (const ConfigError& e) {
    throw ConfigError("the config stored in " + ck.dir() + ": " + e.what());
  }
  // Bounded work: the model's description grows with its layers, and every layer has tensors of
  // its own in the index, so a config naming more layers than the index has tensors (edited in a
  // checkpoint without a manifest) is refused before anything is built from it.
  int64_t weights = 0;
  for (const ckpt::IndexTensor& t : ck.tensors())
    weights += ckpt::split_tensor_path(t.path).first == kMasterState;
  if (cfg.model.n_layers > weights)
    throw Error(detail::concat("checkpoint ", ck.dir(), ": its stored config has model.n_layers = ",
                               cfg.model.n_layers, ", but index.h5 holds ", weights,
                               " weight tensors (every layer has its own): the config attribute "
                               "is corrupt or was edited"));
  return cfg;
}

// The target layout `cfg` gives at `world` ranks (validated, with the --world hint), as the run
// state of a checkpoint written in it.
ckpt::RunState layout_state(ckpt::RunState state, const Config& cfg, int world) {
  try {
    validate_layout(cfg, world);
  } catch (const ConfigError& e) {
    const int64_t ranks = layout_min_ranks(cfg.parallel);
    throw ConfigError(std::string(e.what()) +
                      (ranks > world ? detail::concat("; give the target world size: --world ",
                                                      ranks, " (or a multiple of it)")
                                     : ""));
  }
  state.mesh = mesh_shape(cfg.parallel, world);
  state.zero_stage = cfg.parallel.zero_stage;
  state.sequence_parallel = cfg.parallel.sequence_parallel;
  state.virtual_stages = cfg.parallel.virtual_stages;
  state.pp_layers = cfg.parallel.pp_layers;
  state.pp_v_shape = cfg.parallel.pp > 1 && v_shaped(cfg.parallel.pp_schedule);
  state.ep = cfg.parallel.ep;
  state.zero_shard_group = cfg.parallel.zero_shard_group;
  state.config = to_toml(cfg);
  return state;
}

// Memory before the work: a command whose buffers would not fit in what the host has left is
// refused (exit 2) with the numbers, before it reads a tensor, unless --force.
void check_memory(const std::string& command, const ckpt::ToolMemory& need, bool force) {
  const AvailableMemory have = host_memory_available();
  if (force || static_cast<double>(need.bytes) <= have.bytes) return;
  throw ConfigError(
      detail::concat("checkpoint ", command, " needs ", gib(static_cast<double>(need.bytes)), " (",
                     need.bytes, " bytes) for its buffers (", need.what, "), more than the ",
                     gib(have.bytes), " this machine has left (", have.source,
                     "); run it where there is more memory, or pass --force to try anyway"));
}

// `checkpoint import HF_DIR OUT`: the folder's config.json as [model] (then the user's --set),
// its weights as a one-rank checkpoint, resharded when the layout asks for more ranks.
int import_hf(const std::string& hf_dir, const std::string& out,
              const std::vector<std::string>& overrides, int world_arg) {
  namespace fs = std::filesystem;
  const fs::path config_path = fs::path(hf_dir) / "config.json";
  if (!fs::exists(config_path))
    throw ConfigError("checkpoint import: " + config_path.string() +
                      " is missing (a Hugging Face model folder has config.json and "
                      "model.safetensors)");
  std::ostringstream text;
  text << std::ifstream(config_path).rdbuf();
  Config base;
  base.model = ckpt::hf_model_config(text.str(), config_path.string());
  // A SentencePiece tokenizer beside the weights (Llama's tokenizer.model) becomes the run's
  // data.tokenizer, so generate and eval find it.
  const fs::path spm = fs::path(hf_dir) / "tokenizer.model";
  if (fs::exists(spm)) base.data.tokenizer = fs::absolute(spm).lexically_normal().string();
  Config cfg;
  try {
    cfg = parse_config_string(to_toml(base), config_path.string() + " (imported)", overrides);
  } catch (const ConfigError& e) {
    throw ConfigError("checkpoint import: " + std::string(e.what()));
  }
  const int world = world_arg > 0 ? world_arg : 1;
  ckpt::RunState one;
  one.seed = static_cast<int64_t>(cfg.train.seed);
  Config at_one = cfg;
  at_one.parallel = ParallelConfig{};
  one = layout_state(one, at_one, 1);
  one.config = to_toml(cfg);
  const ckpt::RunState target = layout_state(one, cfg, world);
  const bool reshard =
      target.mesh.world() > 1 || ckpt::layout_text(target) != ckpt::layout_text(one);
  const std::string first = reshard ? out + ".one-rank" : out;
  const ckpt::ImportResult r = ckpt::import_safetensors(hf_dir, cfg.model, one, first);
  for (const std::string& u : r.unused)
    std::fprintf(stderr, "warning: %s: tensor %s is not part of the model; not imported\n",
                 hf_dir.c_str(), u.c_str());
  if (reshard) {
    const ckpt::Checkpoint ck(first);
    ckpt::reshard(ck, ModelSpec::from_config(cfg.model), target, out);
    fs::remove_all(first);
  }
  std::printf(
      "imported %s (%s, %s) as %s: %lld tensors, %lld parameters, layout %s, step 0, weights "
      "only: fine-tune it with checkpoint.init_from = \"%s\"\n",
      hf_dir.c_str(), ckpt::hf_class(cfg.model), r.dtypes.c_str(), out.c_str(),
      static_cast<long long>(r.tensors), static_cast<long long>(r.parameters),
      ckpt::layout_text(target).c_str(), out.c_str());
  return 0;
}

}  // namespace

Run add_checkpoint_command(CLI::App& app) {
  struct Args {
    std::string dir, out, format = "safetensors", tokenizer;
    std::vector<std::string> overrides;
    int world = 0;
    bool config = false;
    bool upgrade = false;
    bool force = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("checkpoint", "Inspect, verify, reshard, export and import checkpoints");
  cmd->require_subcommand(1);
  CLI::App* inspect = cmd->add_subcommand("inspect",
                                          "Print the step, layout, run state and every tensor with "
                                          "its global shape, dtype and L2 norm");
  inspect->add_option("dir", args->dir, "Checkpoint directory")->required();
  inspect->add_flag("--config", args->config, "Also print the resolved config of the run");
  const char* force_help =
      "Go on when the memory its buffers need (estimated from the index before anything is "
      "read) exceeds what this machine has left; without it such a run exits 2 naming both";
  inspect->add_flag("--force", args->force, force_help);
  CLI::App* verify = cmd->add_subcommand(
      "verify",
      "Check the manifest (every file's size and XXH64), then read everything: checksums, "
      "every element of every tensor covered exactly "
      "once, tensors matching the model of the stored config; exit 1 on any problem");
  verify->add_option("dir", args->dir, "Checkpoint directory")->required();
  verify->add_flag("--upgrade", args->upgrade,
                   "A checkpoint written before manifests: once everything verifies, write its "
                   "manifest.json (every file's size and XXH64) so later reads check it first");
  verify->add_flag("--force", args->force, force_help);
  CLI::App* reshard = cmd->add_subcommand(
      "reshard", "Write a copy laid out for another [parallel] layout, tensor by tensor");
  reshard->add_option("dir", args->dir, "Checkpoint directory")->required();
  reshard->add_option("out", args->out, "New checkpoint directory (must not exist)")->required();
  reshard->add_option("--set", args->overrides,
                      "Change the stored config, e.g. parallel.tp=4 (repeatable)");
  reshard
      ->add_option("--world", args->world,
                   "World size of the new layout (default: the checkpoint's)")
      ->check(CLI::PositiveNumber);
  reshard->add_flag("--force", args->force, force_help);

  CLI::App* exporter = cmd->add_subcommand(
      "export",
      "Write a checkpoint's weights for Hugging Face transformers: OUT/model.safetensors + "
      "OUT/config.json (docs/checkpoint-format.md)");
  exporter->add_option("dir", args->dir, "Checkpoint directory")->required();
  exporter->add_option("out", args->out, "Directory to create (must not exist)")->required();
  exporter
      ->add_option("--format", args->format,
                   "safetensors: GPT2LMHeadModel (arch gpt2) or LlamaForCausalLM (arch llama)")
      ->check(CLI::IsMember({"safetensors"}))
      ->capture_default_str();
  exporter->add_option("--tokenizer", args->tokenizer,
                       "SentencePiece model written beside the weights so that AutoTokenizer "
                       "loads it (default: the run's data.tokenizer; \"none\": weights only)");
  exporter->add_flag("--force", args->force, force_help);

  CLI::App* importer = cmd->add_subcommand(
      "import",
      "Write a checkpoint (weights, step 0) from a Hugging Face GPT-2, Llama or Mixtral folder: "
      "config.json + model.safetensors (or its shards); F32, BF16 or F16");
  importer->add_option("dir", args->dir, "The Hugging Face model folder")->required();
  importer->add_option("out", args->out, "New checkpoint directory (must not exist)")->required();
  importer->add_option("--set", args->overrides,
                       "A key of the checkpoint's config, e.g. parallel.tp=2 for its layout or "
                       "model.seq_len (repeatable)");
  importer->add_option("--world", args->world, "World size of the layout to write (default 1)")
      ->check(CLI::PositiveNumber);

  return [args, cmd]() {
    if (cmd->got_subcommand("import"))
      return import_hf(args->dir, args->out, args->overrides, args->world);
    const ckpt::Checkpoint ck = open_checkpoint(args->dir);
    if (cmd->got_subcommand("export")) {
      const Config cfg = stored_config(ck, {});
      check_memory("export", ckpt::export_memory(ck, cfg.model), args->force);
      // The tokenizer: --tokenizer, else the run's own when its file is still there.
      std::string tok_path = args->tokenizer.empty() ? cfg.data.tokenizer : args->tokenizer;
      if (tok_path == "none") tok_path.clear();
      if (!tok_path.empty() && !std::filesystem::exists(tok_path)) {
        if (!args->tokenizer.empty())
          throw ConfigError("--tokenizer " + tok_path + ": file not found");
        std::fprintf(stderr,
                     "warning: the run's tokenizer %s is not on this machine: exporting the "
                     "weights only (give --tokenizer PATH to add it)\n",
                     tok_path.c_str());
        tok_path.clear();
      }
      ckpt::HfTokenizer tok_files;
      if (!tok_path.empty()) {
        const Tokenizer tok(tok_path);
        const std::string mismatch = hf_tokenizer_mismatch(tok);
        if (!mismatch.empty())
          throw ConfigError(mismatch + "; or export the weights alone with --tokenizer none");
        if (tok.vocab_size() > cfg.model.vocab_size)
          throw ConfigError("tokenizer " + tok_path + " has " + std::to_string(tok.vocab_size()) +
                            " pieces, more than the model's vocab_size " +
                            std::to_string(cfg.model.vocab_size));
        tok_files = {tok.bos_id(), tok.eos_id(), hf_tokenizer_files(tok)};
      }
      const ckpt::ExportResult r = ckpt::export_safetensors(ck, cfg.model, args->out, tok_files);
      std::printf(
          "exported checkpoint %s (step %lld) as %s to %s: model.safetensors (%lld tensors, %lld "
          "parameters, %lld bytes) + config.json%s%s\n",
          ck.dir().c_str(), static_cast<long long>(ck.state().step), ckpt::hf_class(cfg.model),
          r.dir.c_str(), static_cast<long long>(r.tensors), static_cast<long long>(r.param_count),
          static_cast<long long>(r.file_bytes),
          tok_path.empty() ? "" : " + the tokenizer (tokenizer.model, tokenizer_config.json) of ",
          tok_path.c_str());
      return 0;
    }
    if (cmd->got_subcommand("inspect")) {
      check_memory("inspect", ckpt::inspect_memory(ck), args->force);
      std::printf("%s", ckpt::inspect(ck, args->config).c_str());
      return 0;
    }
    if (cmd->got_subcommand("verify")) {
      const Config cfg = stored_config(ck, {});
      check_memory("verify", ckpt::verify_memory(ck), args->force);
      const ckpt::VerifyReport r = ckpt::verify(ck, ModelSpec::from_config(cfg.model));
      for (const std::string& e : r.errors) std::fprintf(stderr, "error: %s\n", e.c_str());
      if (!r.errors.empty()) {
        std::fprintf(stderr, "%s: %zu problems\n", ck.dir().c_str(), r.errors.size());
        return 1;
      }
      std::printf(
          "%s: ok: %lld tensors in %lld boxes over %d rank files, %.1f MB read, %s, checksums "
          "and coverage verified\n",
          ck.dir().c_str(), static_cast<long long>(r.tensors), static_cast<long long>(r.boxes),
          ck.state().mesh.world(), static_cast<double>(r.bytes) / 1e6,
          ck.has_manifest() ? "every file's size and XXH64 as its manifest lists them"
                            : "no manifest (written before manifests: its files were parsed "
                              "unchecked)");
      if (args->upgrade && !ck.has_manifest()) {
        ckpt::write_manifest_of(ck.dir(), ck.state().step, ck.state().mesh.world());
        std::printf("%s: wrote %s: later reads check every file against it first\n",
                    ck.dir().c_str(), ckpt::kManifestFile);
      }
      return 0;
    }
    // reshard
    const Config cfg = stored_config(ck, args->overrides);
    const int world = args->world > 0 ? args->world : ck.state().mesh.world();
    const ckpt::RunState state = layout_state(ck.state(), cfg, world);
    const ModelSpec spec = ModelSpec::from_config(cfg.model);
    check_memory("reshard", ckpt::reshard_memory(ck, spec, state), args->force);
    const int64_t bytes = ckpt::reshard(ck, spec, state, args->out);
    std::printf("%s -> %s: %s -> %s, %.1f MB\n", ck.dir().c_str(), args->out.c_str(),
                ckpt::layout_text(ck.state()).c_str(), ckpt::layout_text(state).c_str(),
                static_cast<double>(bytes) / 1e6);
    return 0;
  };
}

}  // namespace llmt::app
