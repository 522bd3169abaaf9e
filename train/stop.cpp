#include "train/stop.h"

#include <csignal>
#include <cstdio>

#include "core/check.h"

namespace llmt {

namespace {

// What a signal handler may touch: a lock-free flag (the process's, like the handlers).
volatile std::sig_atomic_t g_received = 0;
int g_users = 0;  // StopRequests alive (handlers installed by the first, restored by the last)
constexpr int kSignals[] = {SIGTERM, SIGUSR1, SIGINT};
struct sigaction g_previous[3];

void on_signal(int sig) {
  if (sig == SIGINT && g_received == SIGINT) {
    // The second Ctrl-C: end now, as the default action does.
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  if (g_received == 0) g_received = sig;
}

}  // namespace

StopRequests::StopRequests() {
  if (g_users++ > 0) return;
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (MPI progress, file writes) carry on
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &g_previous[i]);
}

StopRequests::~StopRequests() {
  if (--g_users > 0) return;
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
}

int StopRequests::signal() const {
  return g_received;
}

StopConditions::StopConditions(const StopRequests& requests, double time_limit_s)
    : requests_(requests), time_limit_s_(time_limit_s), start_(clock::now()) {}

bool StopConditions::time_up(clock::time_point now, double ahead_s) const {
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  return time_limit_s_ > 0 && elapsed + ahead_s + last_save_s_ >= time_limit_s_;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
  }
  static thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

}  // namespace llmt
