// [comm]'s rules, reported through the config's Rules.
#include "engine/comm/comm_config.h"

#include "config/rules.h"

namespace llmt {

void check_comm_config(const CommConfig& c, Rules& r) {
  r.at_least("comm.timeout_s", c.timeout_s, 0.0, " (0 = no watchdog)");
}

}  // namespace llmt
