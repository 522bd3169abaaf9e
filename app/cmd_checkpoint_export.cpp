// `llmtrain checkpoint export DIR OUT --format safetensors`: a checkpoint's master weights as a
// Hugging Face transformers model directory (docs/checkpoint-export.md). Flags and printing only;
// the mapping and the writer are in checkpoints/export.h.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "app/commands.h"
#include "checkpoints/checkpoint.h"
#include "checkpoints/export.h"
#include "engine/core/check.h"
#include "engine/train/config.h"

namespace llmt::app {
namespace {

namespace fs = std::filesystem;

// DIR itself when it holds index.h5; the checkpoint its `latest` file names when DIR is a
// checkpoint.dir of a run.
std::string resolve_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) throw ConfigError("checkpoint directory " + dir + " does not exist");
  if (fs::exists(fs::path(dir) / ckpt::kIndexFile)) return dir;
  std::ifstream latest(fs::path(dir) / ckpt::kLatestFile);
  std::string name;
  if (latest && std::getline(latest, name) && !name.empty()) return (fs::path(dir) / name).string();
  throw ConfigError("checkpoint directory " + dir + " has no " + ckpt::kIndexFile + " and no " +
                    ckpt::kLatestFile + " file: give a checkpoint (DIR/step_NNNNNNNN)");
}

int run_export(const std::string& dir, const std::string& out) {
  const ckpt::Checkpoint ck(resolve_checkpoint(dir));
  // Only [model] matters here: the data files the run read need not exist on this machine.
  const Config cfg = parse_config_string(ck.state().config,
                                         ck.dir() + "/" + ckpt::kIndexFile + " (config attribute)",
                                         {"data.source=\"synthetic\""});
  const ckpt::ExportResult r = ckpt::export_safetensors(ck, cfg.model, out);
  std::printf(
      "exported checkpoint %s (step %lld) as %s to %s: model.safetensors (%lld tensors, %lld "
      "parameters, %lld bytes) + config.json\n",
      ck.dir().c_str(), static_cast<long long>(ck.state().step), ckpt::hf_class(cfg.model),
      r.dir.c_str(), static_cast<long long>(r.tensors), static_cast<long long>(r.param_count),
      static_cast<long long>(r.file_bytes));
  return 0;
}

}  // namespace

Run add_checkpoint_export(CLI::App* checkpoint_group) {
  struct Args {
    std::string dir, out, format = "safetensors";
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = checkpoint_group->add_subcommand(
      "export",
      "Write a checkpoint's weights for Hugging Face transformers: OUT/model.safetensors + "
      "OUT/config.json (docs/checkpoint-export.md)");
  cmd->add_option("DIR", a->dir, "Checkpoint directory, or a checkpoint.dir with a latest file")
      ->required();
  cmd->add_option("OUT", a->out, "Directory to create (must not exist)")->required();
  cmd->add_option("--format", a->format,
                  "safetensors: GPT2LMHeadModel (arch gpt2) or LlamaForCausalLM (arch llama)")
      ->check(CLI::IsMember({"safetensors"}))
      ->capture_default_str();
  return [a] { return run_export(a->dir, a->out); };
}

}  // namespace llmt::app
