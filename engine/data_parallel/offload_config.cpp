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
  // The folder and the chunk size serve "nvme" only: set without it they would do nothing.
  if (c.optimizer != OffloadTarget::nvme && c.params != OffloadTarget::nvme) {
    const OffloadConfig d;
    r.require(c.nvme_dir == d.nvme_dir, {"offload.nvme_dir"},
              "offload.nvme_dir is set, but neither offload.optimizer nor offload.params is "
              "\"nvme\": set one of them to \"nvme\", or remove offload.nvme_dir");
    r.require(c.buffer_mb == d.buffer_mb, {"offload.buffer_mb"},
              detail::concat("offload.buffer_mb=", c.buffer_mb,
                             " sets the chunks of \"nvme\" offload, but neither "
                             "offload.optimizer nor offload.params is \"nvme\""));
  }
}

}  // namespace llmt
