// ModelSpec: the model's parameters as global names and global shapes, derived from [model]
// before anything is allocated. Parallel transforms (later) change ownership of these shapes,
// never the names; checkpoints, init and tests speak these names (docs/model.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/model_config.h"

namespace llmt {

enum class InitKind : uint8_t { normal, ones, zeros };

struct ParamSpec {
  std::string name;  // global name, e.g. "layers.3.mlp.fc1.weight"
  Shape shape;       // global shape
  InitKind init = InitKind::normal;
  float std = 0.0f;      // for InitKind::normal
  bool decay = false;    // AdamW weight decay applies (2-D weights and embeddings)
};

struct ModelSpec {
  ModelConfig cfg;     // resolved (presets applied)
  int64_t head_dim;    // D = d_model / n_heads
  int64_t n_kv_heads;  // KV
  int64_t qkv_dim;     // (H + 2KV) * D
  int64_t ffn_dim;     // F
  int64_t fc1_out;     // F (gelu) or 2F (swiglu)
  std::vector<ParamSpec> params;

  static ModelSpec from_config(const ModelConfig& cfg);
  int64_t num_params() const;
  // Index of a parameter by name; throws if absent.
  size_t index_of(const std::string& name) const;
  // Training FLOPs per token: 6*N + 6*L*C*T (REFERENCE.md), N without position embeddings.
  double flops_per_token() const;
};

}  // namespace llmt
