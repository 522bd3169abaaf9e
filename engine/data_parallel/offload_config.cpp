// [offload]'s rules, reported through the config's Rules.
#include "engine/data_parallel/offload_config.h"

#include "config/rules.h"

namespace llmt {

void check_offload_config(const OffloadConfig& c, Rules& r) {
  for (const auto& [key, t] :
       {std::pair{"offload.optimizer", c.optimizer}, std::pair{"offload.params", c.params}}) {
    r.require(t != OffloadTarget::host, {key},
              detail::concat(key,
                             "=\"host\" moves the state from a GPU into host memory, which is "
                             "not built yet (and on the CPU backend the state is in host "
                             "memory already); use \"nvme\" (files under offload.nvme_dir) "
                             "or \"none\""));
    r.require(t != OffloadTarget::nvme || !c.nvme_dir.empty(), {key, "offload.nvme_dir"},
              detail::concat(key,
                             "=\"nvme\" keeps the state in files under offload.nvme_dir, "
                             "which is not set: name a directory on a fast local disk"));
  }
  r.at_least("offload.buffer_mb", c.buffer_mb, 1.0);
}

}  // namespace llmt
