// Export of a checkpoint's master weights to Hugging Face transformers (docs/checkpoint-format.md,
// "Export to Hugging Face"): OUT/model.safetensors under the names of GPT2LMHeadModel (arch gpt2),
// LlamaForCausalLM / MixtralForCausalLM (arch llama) or DeepseekV3ForCausalLM (latent
// attention), and OUT/config.json. The mapping is data (a list of HfTensor),
// so the writer streams one tensor at a time and tests can check names and shapes without a
// checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoints/store.h"
#include "checkpoints/tools.h"
#include "engine/model/model_config.h"

namespace llmt::ckpt {

// One tensor of the export: rows [row_begin, row_end) of checkpoint tensor `source` (whole along
// its other dim), transposed when `transpose` (HF GPT-2's Conv1D stores weights (in, out), the
// transpose of our (out, in)). Splits of the fused qkv ([q heads | k heads | v heads]) and swiglu
// fc1 ([gate | up]) are row ranges.
struct HfTensor {
  std::string name;            // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as written: rows x cols, or cols x rows when transposed
  std::string source;          // "model/layers.0.attn.qkv.weight"
  // The box of the source's global tensor it holds: all of it, rows of it (q of qkv), or one
  // expert's rows of a stack (gate of experts.fc1 for expert e: start {e, 0, 0}, count {1, Fe, C}).
  std::vector<int64_t> start, count;
  bool transpose = false;
  // A second copy of a tensor written under another name too (DeepSeek's multi-token prediction
  // layers store the embedding and head again): import checks it is there but reads the first.
  bool copy = false;
};

// "GPT2LMHeadModel" (arch gpt2), "LlamaForCausalLM" (arch llama), "MixtralForCausalLM" (arch
// llama with [model.moe] experts), "DeepseekV3ForCausalLM" (model.attention = "mla").
const char* hf_class(const ModelConfig& cfg);

// The tensors the export of `cfg` (a resolved [model]: presets applied) writes, in file order.
// Throws ConfigError listing every [model] key whose value the target class cannot represent
// (e.g. model.activation="swiglu" with arch gpt2: GPT-2's MLP has no gate).
std::vector<HfTensor> hf_tensors(const ModelConfig& cfg);

// What the export knows of a tokenizer, from the data layer (the app passes it): the special ids
// config.json names (-1: none, written as null) and the files written beside the weights (the
// tokenizer, e.g. tokenizer.model and tokenizer_config.json), as (name, contents).
struct HfTokenizer {
  int32_t bos_id = -1, eos_id = -1;
  std::vector<std::pair<std::string, std::string>> files;
};

// OUT/config.json's text for `cfg` (the same checks as hf_tensors).
std::string hf_config_json(const ModelConfig& cfg, const HfTokenizer& tokenizer = {});

// The safetensors header: u64 little-endian N, then N bytes of JSON ({"__metadata__":
// {"format":"pt"}, name: {"dtype":"F32","shape":[...],"data_offsets":[begin,end]}, ...}, offsets
// from the data start, tensors back to back in the given order) padded with spaces so that N is a
// multiple of 8.
std::string safetensors_header(const std::vector<HfTensor>& tensors);

// Creates the directory `out` (its parents as needed) by fill(tmp) in the sibling ".tmp.<name>",
// synced and renamed to `out` at the end, so `out` appears whole or not at all; tmp is removed
// when fill throws (and first, left from an interrupted run). `what` names the command in the
// error when `out` exists. Returns `out`, normalised ("runs/hf/" -> "runs/hf").
std::string write_directory(const std::string& out, const std::string& what,
                            const std::function<void(const std::filesystem::path& tmp)>& fill);

struct ExportResult {
  std::string dir;          // OUT
  int64_t tensors = 0;      // tensors in model.safetensors
  int64_t file_bytes = 0;   // size of model.safetensors
  int64_t param_count = 0;  // elements written
};

// Writes OUT/model.safetensors and OUT/config.json from the master weights ("model/...") of
// `ckpt`, whose resolved [model] is `cfg`, and the tokenizer's files when given. Works in OUT's
// sibling ".tmp.<name>" and renames it to OUT at the end, so OUT appears complete or not at all.
// Throws ConfigError when OUT exists or the model cannot be represented, Error when the
// checkpoint's tensors do not fit `cfg` or a read or write fails (naming the tensor or file).
// The most memory export_safetensors' buffers hold at once: the largest tensor it writes (twice
// when transposed), and the largest box read whole to check it (tools.h).
ToolMemory export_memory(const Checkpoint& ckpt, const ModelConfig& cfg);

ExportResult export_safetensors(const Checkpoint& ckpt, const ModelConfig& cfg,
                                const std::string& out, const HfTokenizer& tokenizer = {});

}  // namespace llmt::ckpt
