// [checkpoint]'s rules, reported through the config's Rules.
#include "checkpoints/checkpoint_config.h"

#include "config/rules.h"

namespace llmt {

using detail::concat;

void check_checkpoint_config(const CheckpointConfig& ck, Rules& r) {
  r.at_least<int64_t>("checkpoint.interval", ck.interval, 0, " (0 = save only at the end)");
  r.at_least<int64_t>("checkpoint.keep_last", ck.keep_last, 0, " (0 = keep all)");
  r.require(!ck.load.empty(), {"checkpoint.load"},
            "checkpoint.load must be \"none\", \"latest\", \"auto\" or a checkpoint path");
  r.require(
      !(ck.dir.empty() && (ck.load == "latest" || ck.load == "auto")),
      {"checkpoint.load", "checkpoint.dir"},
      concat("checkpoint.load=\"", ck.load, "\" resumes from checkpoint.dir, which is not set"));
  r.require(!(ck.dir.empty() && (ck.interval > 0 || ck.keep_last > 0)),
            {"checkpoint.interval", "checkpoint.keep_last", "checkpoint.dir"},
            "checkpoint.interval and checkpoint.keep_last need checkpoint.dir");
}

}  // namespace llmt
