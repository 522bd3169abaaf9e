// The small models the unit and mpi tests build (a few layers, width 16-64, so the whole suite
// runs in minutes on 2 cores): a preset with the numbers each test needs. Header-only.
#pragma once

#include <cstdint>

#include "engine/model/model_config.h"

namespace llmt::test {

struct Tiny {
  int64_t vocab = 37, layers = 2, d_model = 16, heads = 4;
  int64_t llama_kv_heads = 2;  // Llama only; GPT-2 keeps n_heads
  int64_t seq_len = 7;
  int64_t d_ff = 0;  // 0: the preset's for d_model (preset_d_ff)
  float init_std = 0.02f, dropout = 0.0f;
};

inline ModelConfig tiny_model(Arch arch, const Tiny& t) {
  ModelConfig c = model_preset(arch);
  c.vocab_size = t.vocab;
  c.n_layers = t.layers;
  c.d_model = t.d_model;
  c.n_heads = t.heads;
  if (arch == Arch::llama) c.n_kv_heads = t.llama_kv_heads;
  c.seq_len = t.seq_len;
  c.d_ff = t.d_ff > 0 ? t.d_ff : preset_d_ff(arch, t.d_model);
  c.init_std = t.init_std;
  c.dropout = t.dropout;
  return c;
}

}  // namespace llmt::test
