// Import of Hugging Face weights (docs/checkpoint-format.md, "Import from Hugging Face"): the
// inverse of export.h. A GPT2LMHeadModel, LlamaForCausalLM or MixtralForCausalLM folder
// (config.json and model.safetensors, or shards listed by model.safetensors.index.json; F32, BF16
// or F16) becomes an llmtrain checkpoint of the master weights at step 0, which
// checkpoint.init_from fine-tunes at any layout. The tensor mapping is export's (hf_tensors):
// import(export(c)) gives back c's weights bitwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoints/store.h"
#include "engine/model/model_config.h"

namespace llmt::ckpt {

// [model] from a config.json's text (`what` names the file in errors). Throws ConfigError
// listing every setting llmtrain cannot represent (e.g. rope_scaling, a sliding window,
// attention biases without MLP biases).
ModelConfig hf_model_config(const std::string& config_json, const std::string& what);

struct ImportResult {
  int64_t tensors = 0;              // safetensors tensors read
  int64_t parameters = 0;           // elements written
  int64_t bytes = 0;                // of the rank file
  std::string dtypes;               // the source dtypes, e.g. "BF16"
  std::vector<std::string> unused;  // safetensors tensors that are neither weights nor buffers
};

// Writes the checkpoint of `hf_dir`'s weights for model `cfg` (hf_model_config's, possibly
// changed by the user where shapes allow) into the new directory `out` at one rank: the run state
// `state` (its mesh one rank), state "param" only. Reads and writes one global tensor at a time.
// Throws Error naming the file and tensor when one is missing, has another shape or dtype, or
// lies outside its file.
ImportResult import_safetensors(const std::string& hf_dir, const ModelConfig& cfg,
                                const RunState& state, const std::string& out);

}  // namespace llmt::ckpt
