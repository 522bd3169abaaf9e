// ModelSpec: the model's parameters as global names and global shapes, derived from [model]
// before anything is allocated. Parallel transforms change what a rank holds (ParamSpec::shape,
// from each parameter's Placement on the tp axis), never the names or global shapes;
// checkpoints, init and tests speak these names (docs/model.md, docs/parallelism.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/model_config.h"
#include "engine/parallel/placement.h"

namespace llmt {

enum class InitKind : uint8_t { normal, ones, zeros };

struct ParamSpec {
  std::string name;  // global name, e.g. "layers.3.mlp.fc1.weight"
  Shape shape;       // what this rank holds: global_shape until a parallel transform shards it
  Shape global_shape;
  InitKind init = InitKind::normal;
  float std = 0.0f;    // for InitKind::normal
  bool decay = false;  // AdamW weight decay applies (2-D weights and embeddings)
  // Megatron 1D tensor parallelism: column-parallel qkv/fc1 Shard(0) by head groups / [gate|up],
  // row-parallel proj/fc2 Shard(1) (their biases replicated, added after the all-reduce),
  // vocab-parallel wte/lm_head Shard(0), norms and wpe replicated.
  Placement tp;
};

struct ModelSpec {
  ModelConfig cfg;     // resolved (presets applied)
  int64_t head_dim;    // D = d_model / n_heads
  int64_t n_kv_heads;  // KV
  int64_t qkv_dim;     // (H + 2KV) * D
  int64_t ffn_dim;     // F
  int64_t fc1_out;     // F (gelu) or 2F (swiglu)
  std::vector<ParamSpec> params;
  // The tp group this spec is sharded for (shard_tp); 1, 0 = the whole model.
  int tp_size = 1, tp_rank = 0;

  static ModelSpec from_config(const ModelConfig& cfg);
  // The transform to tp rank `rank` of `size`: every ParamSpec::shape becomes the shape that rank
  // holds under its Placement (names and global shapes stay). Throws, with the numbers, when
  // heads, kv heads, d_ff or the vocabulary do not divide by size.
  ModelSpec shard_tp(int size, int rank) const;
  // The slices of parameter i's global tensor this rank holds, in local order.
  std::vector<ShardSlice> local_slices(size_t i) const;
  int64_t num_params() const;        // global
  int64_t num_local_params() const;  // this rank's
  // Index of a parameter by name; throws if absent.
  size_t index_of(const std::string& name) const;
  // Training FLOPs per token: 6*N + 6*L*C*T (REFERENCE.md), N without position embeddings.
  double flops_per_token() const;
};

// What [model] must satisfy for tp (and sequence parallelism): one message per violation, each
// naming the keys and numbers; empty when the layout fits. shard_tp throws the first; config
// validation (engine/train/config.cpp) reports the same conditions with file positions.
std::vector<std::string> tensor_parallel_errors(const ModelConfig& cfg, int64_t tp,
                                                bool sequence_parallel);

}  // namespace llmt
