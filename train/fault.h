// A test aid for the fault matrix (tests/mpi/production.py, docs/slurm.md): with
// LLMTRAIN_FAULT="PHASE:STEP:RANK:SIGNAL" in the environment, world rank RANK raises SIGNAL (TERM,
// USR1, INT or KILL) in itself when it reaches PHASE of step STEP: forward (before the step's
// forward), micro (before its second micro-batch; not under pp), backward (after the backward,
// before the gradients are synchronised), optimizer (before the update), save (the step's
// checkpoint files written, not yet committed) or load (a checkpoint read, before the first step;
// STEP is ignored). SIGNAL WAIT raises nothing: in a run that started from scratch the rank waits
// there until a stop signal reaches the process from outside (the others wait in their next
// collective), so a test can deliver a signal mid-run however slowly it travels
// (tests/e2e/check_slurm.py); a resumed run (the same environment, requeued) passes. Without the
// variable it does nothing.
#pragma once

#include <cstdint>
#include <string>

#include "train/stop.h"

namespace llmt {

class FaultInjector {
 public:
  // Reads LLMTRAIN_FAULT; throws ConfigError on a malformed value. `stops`: the process's stop
  // requests, which WAIT polls.
  FaultInjector(int world_rank, const StopRequests& stops);
  void at(const char* phase, int64_t step) const;
  // The run resumed from a checkpoint: WAIT no longer waits.
  void resumed() { wait_ = false; }

 private:
  const StopRequests& stops_;
  bool armed_ = false;
  bool wait_ = true;
  std::string phase_;
  int64_t step_ = 0;
  int signal_ = 0;
};

}  // namespace llmt
