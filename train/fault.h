// A test aid for the fault matrix (tests/mpi/production.py, docs/slurm.md): with
// LLMTRAIN_FAULT="PHASE:STEP:RANK:SIGNAL" in the environment, world rank RANK raises SIGNAL (TERM,
// USR1, INT or KILL) in itself when it reaches PHASE of step STEP: forward (before the step's
// forward), backward (after the backward, before the gradients are synchronised), optimizer
// (before the update), save (the step's checkpoint files written, not yet committed) or load
// (a checkpoint read, before the first step; STEP is ignored). Without the variable it does
// nothing.
#pragma once

#include <cstdint>
#include <string>

namespace llmt {

class FaultInjector {
 public:
  // Reads LLMTRAIN_FAULT; throws ConfigError on a malformed value.
  explicit FaultInjector(int world_rank);
  void at(const char* phase, int64_t step) const;

 private:
  bool armed_ = false;
  std::string phase_;
  int64_t step_ = 0;
  int signal_ = 0;
};

}  // namespace llmt
