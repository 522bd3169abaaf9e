// [comm] section: how the communicators behave (docs/slurm.md). Lives with the communicators;
// train parses it.
#pragma once

namespace llmt {

class Rules;

struct CommConfig {
  // The watchdog: a collective that has not completed after this many seconds aborts the job,
  // naming the rank, the operation and the group (Communicator::set_timeout); 0 = never.
  double timeout_s = 600;
};

// [comm]'s rules: timeout_s >= 0.
void check_comm_config(const CommConfig& c, Rules& r);

}  // namespace llmt
