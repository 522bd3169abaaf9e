#include "train/fault.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "core/check.h"

namespace llmt {

namespace {
constexpr int kWait = -1;  // SIGNAL WAIT
}  // namespace

FaultInjector::FaultInjector(int world_rank, const StopRequests& stops) : stops_(stops) {
  const char* v = std::getenv("LLMTRAIN_FAULT");
  if (!v || !*v) return;
  std::string phase, step, rank, sig;
  std::istringstream in(v);
  std::getline(in, phase, ':');
  std::getline(in, step, ':');
  std::getline(in, rank, ':');
  std::getline(in, sig, ':');
  const bool known_phase = phase == "forward" || phase == "micro" || phase == "backward" ||
                           phase == "optimizer" || phase == "save" || phase == "load";
  const int s = sig == "TERM"   ? SIGTERM
                : sig == "USR1" ? SIGUSR1
                : sig == "INT"  ? SIGINT
                : sig == "KILL" ? SIGKILL
                : sig == "WAIT" ? kWait
                                : 0;
  if (!known_phase || s == 0 || step.empty() || rank.empty())
    throw ConfigError(std::string("LLMTRAIN_FAULT=\"") + v +
                      "\": expected PHASE:STEP:RANK:SIGNAL with PHASE forward, micro, backward, "
                      "optimizer, save or load and SIGNAL TERM, USR1, INT, KILL or WAIT");
  armed_ = std::atoi(rank.c_str()) == world_rank;
  phase_ = phase;
  step_ = std::atoll(step.c_str());
  signal_ = s;
}

void FaultInjector::at(const char* phase, int64_t step) const {
  if (!armed_ || phase_ != phase || (phase_ != "load" && step != step_)) return;
  if (signal_ != kWait) {
    std::raise(signal_);
    return;
  }
  while (wait_ && stops_.signal() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

}  // namespace llmt
