// Ending a run early on request (docs/slurm.md): SIGTERM, SIGUSR1 (Slurm's --signal) and the
// first SIGINT only set a flag; the trainer asks at every step end (and between the micro-batches
// of a step, which it then drops), all ranks agree with one all-reduce, and the run saves a
// checkpoint, writes the step's metrics and exits kExitStopped.
// A second SIGINT ends the process at once (the default action).
#pragma once

namespace llmt {

// The exit code of a run stopped early after saving (EX_TEMPFAIL: resume it).
constexpr int kExitStopped = 75;

// Installs the handlers for its lifetime (the previous ones are restored by the destructor).
// Signal dispositions and the flag belong to the process: StopRequests alive at once (trainers
// of one process) share them; the first installs, the last restores.
class StopRequests {
 public:
  StopRequests();
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
  // The first stop signal this process received since construction; 0 if none.
  int signal() const;
};

// "SIGTERM", "SIGUSR1", "SIGINT", or "signal N".
const char* signal_name(int sig);

}  // namespace llmt
