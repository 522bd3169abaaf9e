// The model one rank of a run builds, in one place: the trainer constructs it for training, and
// `plan` constructs the same on the meta device (make_meta_backend, groups of the mesh's shape
// only) to count the activation memory that model lays out, so no byte formula of the model's
// buffers exists outside the code that allocates them.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/model/transformer.h"
#include "train/config.h"

namespace llmt {

// rank_spec: parallelize(spec, layout, rank). tp, cp, ep: the rank's groups (null where the axis
// has one rank; ep's rank must be the one rank_spec holds the experts of). Parameters are not
// initialised.
std::unique_ptr<Transformer> make_rank_model(const Config& cfg, const ModelSpec& rank_spec,
                                             Allocator& alloc, Communicator* tp, Communicator* cp,
                                             Communicator* ep);

// The K/V payload a cp ring or Ulysses group moves for this config (ContextParallel::payload,
// cp_payload; docs/parallelism.md, "Context parallelism"): multi-head latent attention's kv
// latent and RoPE key, kv_lora_rank + qk_rope_head_dim values a position, unless
// parallel.cp_latent is false or the schedule splits the backward (the payload's weight gradient
// is added during the input half); else 0.
int64_t cp_kv_payload(const Config& cfg);

}  // namespace llmt
