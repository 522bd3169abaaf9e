#include "engine/comm/mpi/watch.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/check.h"

namespace llmt::mpi {

namespace {

constexpr int kQuestionTag = 1;
constexpr int kAnswerTag = 2;

// The question: which group. The answer: what this rank knows of it and where it waits. Fixed
// size, sent as bytes (every rank runs the same binary).
struct Question {
  uint64_t key = 0;
};
struct Reply {
  int64_t started = -1;  // -1: no such group here
  int64_t seq = 0;       // the wait's collective number (0: p2p or not waiting)
  int32_t waiting = 0;
  int32_t group_size = 0;
  int32_t peer = -1;
  char group[40] = {};
  char op[24] = {};
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string describe_wait(const char* op, int64_t seq, const char* group, int size, int peer) {
  std::string s = op;
  if (seq > 0) s += detail::concat(" #", seq);
  s += detail::concat(" on ", group, " (", size, size == 1 ? " rank" : " ranks", ")");
  if (peer >= 0) s += detail::concat(" with rank ", peer);
  return s;
}

}  // namespace

uint64_t group_key(const std::string& name, const std::vector<int>& world_ranks) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const unsigned char*>(p)[i];
      h *= 1099511628211ull;
    }
  };
  mix(name.data(), name.size());
  for (int r : world_ranks) mix(&r, sizeof r);
  return h;
}

struct Watch::Channel {
  MPI_Comm comm = MPI_COMM_NULL;
};

Watch::Watch() : channel_(std::make_unique<Channel>()) {
  MPI_Comm_dup(MPI_COMM_WORLD, &channel_->comm);
  MPI_Comm_set_errhandler(channel_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(channel_->comm, &world_rank_);
}

Watch::~Watch() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && channel_->comm != MPI_COMM_NULL) MPI_Comm_free(&channel_->comm);
}

void Watch::add(const WatchedGroup* g) {
  groups_.push_back(g);
}

void Watch::remove(const WatchedGroup* g) {
  groups_.erase(std::remove(groups_.begin(), groups_.end(), g), groups_.end());
}

void Watch::serve() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQuestionTag, channel_->comm, &flag, &st) != MPI_SUCCESS ||
        !flag)
      return;
    Question q;
    MPI_Recv(&q, sizeof q, MPI_BYTE, st.MPI_SOURCE, kQuestionTag, channel_->comm,
             MPI_STATUS_IGNORE);
    Reply r;
    for (const WatchedGroup* g : groups_)
      if (g->key == q.key) r.started = g->started;
    if (waiting_.group) {
      r.waiting = 1;
      r.seq = waiting_.seq;
      r.group_size = static_cast<int32_t>(waiting_.group->world_ranks.size());
      r.peer = waiting_.peer >= 0 ? waiting_.group->world_ranks[waiting_.peer] : -1;
      std::snprintf(r.group, sizeof r.group, "%s", waiting_.group->name.c_str());
      std::snprintf(r.op, sizeof r.op, "%s", waiting_.op);
    }
    // The asker may already have ended the job; an answer nobody receives is harmless.
    MPI_Request req;
    if (MPI_Isend(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, kAnswerTag, channel_->comm, &req) ==
        MPI_SUCCESS) {
      // Small enough to go eagerly; waiting keeps `r` alive until MPI has taken it.
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
  }
}

std::string Watch::verdict_text(int world_rank, const WaitPoint& w, double timeout_s,
                                double grace_s, const std::vector<Answer>& answers) {
  const WatchedGroup& g = *w.group;
  std::string ranks;
  for (size_t i = 0; i < g.world_ranks.size() && i < 16; ++i)
    ranks += detail::concat(i ? ", " : "", g.world_ranks[i]);
  if (g.world_ranks.size() > 16) ranks += ", ...";
  std::string out = detail::concat(
      "error: rank ", world_rank, ": ",
      describe_wait(w.op, w.seq, g.name.c_str(), static_cast<int>(g.world_ranks.size()),
                    w.peer >= 0 ? g.world_ranks[w.peer] : -1),
      " did not complete within ", timeout_s,
      " s (comm.timeout_s; the group's world ranks: ", ranks, "); asked ",
      w.seq > 0 ? "its other ranks" : "the peer", " where they are for ", grace_s, " s:\n");
  std::vector<int> missing;
  for (const Answer& a : answers) {
    out += detail::concat("  rank ", a.world_rank, ": ");
    if (!a.answered) {
      out += "did not answer: it is outside every collective (computing, stopped or hung)";
      missing.push_back(a.world_rank);
    } else if (w.seq > 0 && !a.has_group) {
      out += "has no group " + g.name + " of these ranks (a different mesh or config?)";
      missing.push_back(a.world_rank);
    } else {
      const bool reached = w.seq == 0 || a.started >= w.seq;
      if (w.seq > 0) {
        out += reached ? "reached it"
                       : detail::concat("has not reached it (started ", a.started,
                                        " collectives on ", g.name, ")");
        out += "; ";
      }
      out += a.waiting_in.empty() ? "not waiting in any collective" : "waits in " + a.waiting_in;
      if (!reached) missing.push_back(a.world_rank);
    }
    out += "\n";
  }
  if (w.seq > 0) {
    std::string list;
    for (size_t i = 0; i < missing.size(); ++i) list += detail::concat(i ? ", " : "", missing[i]);
    out += missing.empty() ? std::string("every rank reached it: it is stuck inside MPI")
                           : "ranks that did not reach it: " + list;
    out += "; aborting the job\n";
  } else {
    out += "aborting the job\n";
  }
  return out;
}

void Watch::verdict(const WaitPoint& w, double timeout_s, double grace_s) {
  const WatchedGroup& g = *w.group;
  std::vector<int> ask;
  if (w.seq > 0) {
    for (int r : g.world_ranks)
      if (r != world_rank_) ask.push_back(r);
  } else if (w.peer >= 0) {
    ask.push_back(g.world_ranks[w.peer]);
  }
  const Question q{g.key};
  std::vector<Reply> replies(ask.size());
  std::vector<MPI_Request> sends(ask.size(), MPI_REQUEST_NULL), recvs(ask.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < ask.size(); ++i) {
    MPI_Isend(&q, sizeof q, MPI_BYTE, ask[i], kQuestionTag, channel_->comm, &sends[i]);
    MPI_Irecv(&replies[i], sizeof(Reply), MPI_BYTE, ask[i], kAnswerTag, channel_->comm, &recvs[i]);
  }
  std::vector<int> got(ask.size(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const WaitPoint mine = waiting_;
  waiting_ = w;  // another rank asking this one learns where it is stuck
  while (seconds_since(t0) < grace_s) {
    serve();
    bool all = true;
    for (size_t i = 0; i < ask.size(); ++i) {
      if (!got[i]) MPI_Test(&recvs[i], &got[i], MPI_STATUS_IGNORE);
      all = all && got[i];
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  waiting_ = mine;
  std::vector<Answer> answers;
  for (size_t i = 0; i < ask.size(); ++i) {
    Answer a;
    a.world_rank = ask[i];
    a.answered = got[i] != 0;
    if (a.answered) {
      const Reply& r = replies[i];
      a.has_group = r.started >= 0;
      a.started = r.started;
      if (r.waiting) {
        char group[sizeof r.group + 1] = {}, op[sizeof r.op + 1] = {};
        std::memcpy(group, r.group, sizeof r.group);
        std::memcpy(op, r.op, sizeof r.op);
        a.waiting_in = describe_wait(op, r.seq, group, r.group_size, r.peer);
      }
    }
    answers.push_back(std::move(a));
  }
  const std::string text = verdict_text(world_rank_, w, timeout_s, grace_s, answers);
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace llmt::mpi
