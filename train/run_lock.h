// One run per directory: rank 0 holds an exclusive flock on DIR/.llmtrain.lock (train.run_dir,
// and checkpoint.dir when set) for the run's life, with "host pid" written inside. A second run
// on the same directory stops before touching anything, naming the holder. The kernel releases
// the lock when the process ends, however it ends, so a killed run leaves nothing stale.
#pragma once

#include <string>

namespace llmt {

class RunLock {
 public:
  // Creates `dir` if needed and locks it; throws ConfigError naming `what` (the key, e.g.
  // "train.run_dir"), the directory and the holder's host and pid when another process holds it.
  RunLock(const std::string& dir, const std::string& what);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace llmt
