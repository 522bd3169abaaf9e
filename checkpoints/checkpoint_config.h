// [checkpoint] section: where and how often training saves, and what it resumes from. Lives with
// the checkpoint code; train parses it (docs/configuration.md).
#pragma once

#include <cstdint>
#include <string>

namespace llmt {

class Rules;

struct CheckpointConfig {
  std::string dir;        // checkpoints go to DIR/step_NNNNNNNN; "" = never save
  int64_t interval = 0;   // save every `interval` steps (0: only at the end of the run)
  int64_t keep_last = 0;  // keep the newest keep_last checkpoints in dir; 0 = keep all
  // "none": start from initialisation; "latest": resume from DIR/latest (an error if there is
  // none); "auto": "latest" when it exists, else start from initialisation; anything else: the
  // path of a checkpoint directory (or of a dir holding a `latest` file).
  std::string load = "none";
  // Fine-tuning: the weights of this checkpoint (a checkpoint directory, or a directory holding a
  // `latest` file), at any layout, when the run starts fresh (load found no checkpoint to resume):
  // step 0, a fresh optimizer, schedule and data order. The model must be the same (its shapes,
  // and every [model] key but dropout, init_std, seq_len and the MoE loss and capacity settings).
  std::string init_from;
  // Write in the background: the state this rank writes is copied to host memory, training goes
  // on, and the checkpoint completes at a later step (costs one host copy of that state).
  bool async = false;
};

// [checkpoint]'s rules: ranges, and what load and the save keys need of dir.
void check_checkpoint_config(const CheckpointConfig& ck, Rules& r);

}  // namespace llmt
