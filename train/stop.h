// Ending a run early on request (docs/slurm.md): SIGTERM, SIGUSR1 (Slurm's --signal) and the
// first SIGINT only set a flag; the trainer asks at every step end (and between the micro-batches
// of a step, which it then drops), all ranks agree with one all-reduce, and the run saves a
// checkpoint, writes the step's metrics and exits kExitStopped.
// A second SIGINT ends the process at once (the default action).
#pragma once

#include <chrono>

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

// What one rank brings to the agreement to stop (at a step end, or between the micro-batches of a
// step): its stop signal, and whether train.time_limit, counted from construction, would pass
// within the given seconds of work and one more save as long as the run's last one.
class StopConditions {
 public:
  using clock = std::chrono::steady_clock;
  // time_limit_s: train.time_limit (0: none).
  StopConditions(const StopRequests& requests, double time_limit_s);
  int signal() const { return requests_.signal(); }
  // At `now`: elapsed + ahead_s + the last save's seconds >= the limit.
  bool time_up(clock::time_point now, double ahead_s) const;
  // The run's latest save blocked training for `seconds`.
  void saved(double seconds) { last_save_s_ = seconds; }

 private:
  const StopRequests& requests_;
  const double time_limit_s_;
  const clock::time_point start_;
  double last_save_s_ = 0;
};

// "SIGTERM", "SIGUSR1", "SIGINT", or "signal N".
const char* signal_name(int sig);

}  // namespace llmt
