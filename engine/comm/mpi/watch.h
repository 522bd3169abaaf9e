// The watchdog's view of the other ranks (comm.timeout_s). When a wait on this rank times out, the
// watchdog asks the group's other ranks where they are before it ends the job, and names the ranks
// that did not reach the operation: each rank answers with the number of collectives it has
// started on that group and the operation it is waiting in now. Ranks answer from inside their own
// watched waits (every Handle::wait of the MPI backend polls for questions), so a rank that is
// computing, stopped or hung outside any collective does not answer, and that is what the verdict
// says of it. Questions and answers travel on a duplicate of MPI_COMM_WORLD of their own, so they
// never match the training's messages. Private to the MPI backend; no MPI type appears here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llmt::mpi {

// One group as the watchdog knows it on this rank.
struct WatchedGroup {
  std::string name;              // "dp", "tp", "world", ...
  std::vector<int> world_ranks;  // its members' world ranks, in group rank order
  uint64_t key = 0;              // the same on every member: a hash of the name and the members
  int64_t started = 0;           // collectives this rank has started on it (p2p calls excluded)
};

// What this rank waits in now.
struct WaitPoint {
  const WatchedGroup* group = nullptr;  // none: not waiting
  const char* op = "";                  // "all_reduce", "recv", ...
  int64_t seq = 0;                      // the collective's number on the group (1-based); 0: p2p
  int peer = -1;                        // p2p: the peer's rank in the group
};

class Watch {
 public:
  // Duplicates MPI_COMM_WORLD (a collective call over it).
  Watch();
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  void add(const WatchedGroup* g);
  void remove(const WatchedGroup* g);
  void begin_wait(const WaitPoint& w) { waiting_ = w; }
  void end_wait() { waiting_ = {}; }
  // Answers every question that has arrived (non-blocking).
  void serve();
  // The verdict on `w` (this rank's wait, timed out after `timeout_s`): asks the members that
  // matter (every other member for a collective, the peer for p2p) for up to `grace_s` while
  // answering their questions, prints which ranks did not reach the operation and where each
  // one is, then ends the job (MPI_Abort, exit 1).
  [[noreturn]] void verdict(const WaitPoint& w, double timeout_s, double grace_s);

  // The verdict's text from the answers.
  struct Answer {
    int world_rank = 0;
    bool answered = false;
    bool has_group = false;  // the rank knows a group of this name and members
    int64_t started = 0;     // collectives it started on the group
    std::string waiting_in;  // "all_gather #12 on tp (2 ranks)", empty: not in a wait
  };
  static std::string verdict_text(int world_rank, const WaitPoint& w, double timeout_s,
                                  double grace_s, const std::vector<Answer>& answers);

 private:
  struct Channel;  // the duplicate of MPI_COMM_WORLD questions travel on
  std::unique_ptr<Channel> channel_;
  int world_rank_ = 0;
  std::vector<const WatchedGroup*> groups_;
  WaitPoint waiting_;
};

// The key of a group: FNV-1a over the name and the members' world ranks.
uint64_t group_key(const std::string& name, const std::vector<int>& world_ranks);

}  // namespace llmt::mpi
