// The pipeline's point-to-point traffic under NCCL's semantics, modelled without NCCL or MPI: for
// every schedule x p in {2,3,4,8} x m in {p,2p,4p} (interleaved with v = 2 and 4), each rank
// posts p2p_message() of its p2p actions in action order, exactly as the executor does. NCCL
// ignores tags: per channel (p2p_channel(tag, p2p_channels), one NCCL communicator each) and
// ordered pair of ranks, the k-th send meets the k-th receive. Three checks:
//  - Roles: each rank's stream of a channel only sends to one peer or only receives from one.
//  - Matching: every receive meets the message whose tag it asked for (a wrong pairing of two
//    same-sized tensors would silently swap data).
//  - Progress: each channel is one CUDA stream per rank, and an NCCL send or receive blocks its
//    stream until the peer's stream reaches the matching call ("blocking for the GPU", NCCL's
//    documentation); the host waits where the executor waits (a compute action on the receives it
//    reads, a backward on its own activation send, the end of the step on every send). On a GPU
//    the receives are waited by the compute stream (Handle::device_wait), whose work every later
//    call of the rank waits for: the model's host wait imposes the same order and more. The run
//    must finish: no cycle of streams and hosts waiting on each other.
// P2pMatchingLimits records what a device-synchronizing cudaFree would do to that (why the CUDA
// backend allocates stream-ordered).
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/schedule/schedule.h"
#include "tests/unit/schedule/schedule_cases.h"

namespace llmt {
namespace {

using testing_cases::Case;
using testing_cases::case_name;

std::vector<Case> all_cases() {
  return testing_cases::schedule_cases({2, 3, 4, 8},
                                       {2, 4});  // 3: interleaving closes an odd ring p-1 -> 0
}

class P2pMatching : public testing::TestWithParam<Case> {
 protected:
  Schedule schedule() const {
    const Case& c = GetParam();
    return make_schedule(c.kind, ScheduleShape{c.p, c.v, c.m});
  }
};

// Matching: per (channel, sender, receiver), the tags of the sends in posting order equal the
// tags the receives ask for, in posting order.
TEST_P(P2pMatching, EveryReceiveMeetsItsTag) {
  const Schedule s = schedule();
  using Link = std::tuple<int, int, int>;  // (channel, sender, receiver)
  std::map<Link, std::vector<int>> sent, asked;
  std::set<int> tags;
  for (int r = 0; r < s.shape.stages; ++r) {
    for (const Action& a : s.ranks[static_cast<size_t>(r)]) {
      if (!is_p2p(a.kind)) continue;
      const P2pMessage msg = p2p_message(s.shape, r, a);
      if (msg.local) continue;  // a hand-off within the rank (the executor posts nothing)
      const int ch = p2p_channel(msg.tag, p2p_channels(s.shape));
      ASSERT_GE(ch, 0);
      ASSERT_LT(ch, p2p_channels(s.shape));
      if (msg.send) {
        sent[{ch, r, msg.peer}].push_back(msg.tag);
        EXPECT_TRUE(tags.insert(msg.tag).second) << "tag " << msg.tag << " sent twice";
      } else {
        asked[{ch, msg.peer, r}].push_back(msg.tag);
      }
    }
  }
  EXPECT_EQ(sent.size(), asked.size());
  for (const auto& [link, want] : asked) {
    const auto [ch, from, to] = link;
    const std::vector<int>& got = sent[link];
    ASSERT_EQ(got.size(), want.size()) << "channel " << ch << ", rank " << from << " -> " << to;
    for (size_t k = 0; k < want.size(); ++k)
      ASSERT_EQ(got[k], want[k]) << "channel " << ch << ", rank " << from << " -> " << to
                                 << ": receive #" << k << " asks for tag " << want[k]
                                 << " and meets the send of tag " << got[k];
  }
}

// Progress: the streams and hosts described in the file comment, run until nothing moves.
class NcclModel {
 public:
  // syncing_frees: a backward (which frees buffers) first waits for every call its rank posted,
  // as a cudaFree does (it synchronizes the device); the CUDA backend's stream-ordered
  // cudaFreeAsync does not. syncing_first_launch: the first compute action of each kind on a
  // rank does so, as the first launch of a kernel may under lazy module loading.
  explicit NcclModel(const Schedule& s, bool syncing_frees = false,
                     bool syncing_first_launch = false)
      : s_(s),
        syncing_frees_(syncing_frees),
        syncing_first_launch_(syncing_first_launch),
        pc_(static_cast<size_t>(s.shape.stages), 0) {}

  // Returns "" when every rank finished, else where each rank and stream stands.
  std::string run() {
    check_roles();
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < p(); ++r) moved |= advance_host(r);
      for (auto& [stream, q] : streams_) moved |= match(stream);
    }
    std::ostringstream stuck;
    for (int r = 0; r < p(); ++r) {
      const auto& acts = s_.ranks[static_cast<size_t>(r)];
      const size_t pc = pc_[static_cast<size_t>(r)];
      if (pc < acts.size() || !all_sends_done(r))
        stuck << "rank " << r << " host waits at "
              << (pc < acts.size() ? format_actions({acts[pc]}, s_.shape.virtual_stages, true)
                                   : std::string("the end of the step"))
              << "; ";
    }
    for (const auto& [stream, q] : streams_)
      if (!q.empty())
        stuck << "rank " << stream.first << " channel " << stream.second << " stream blocked in "
              << (ops_[q.front()].send ? "send to " : "recv from ") << ops_[q.front()].peer
              << " (tag " << ops_[q.front()].tag << "); ";
    return stuck.str();
  }
  int mismatches() const { return mismatches_; }

 private:
  struct Op {
    int rank;
    bool send;
    int peer, tag;
    bool done = false;
  };
  using Key = std::tuple<int, int, ActionKind>;  // (mb, chunk, kind of the p2p action)

  int p() const { return s_.shape.stages; }
  void check_roles() const {
    std::map<std::pair<int, int>, std::pair<bool, int>> role;  // stream -> (send, peer)
    for (int r = 0; r < p(); ++r)
      for (const Action& a : s_.ranks[static_cast<size_t>(r)]) {
        if (!is_p2p(a.kind)) continue;
        const P2pMessage msg = p2p_message(s_.shape, r, a);
        if (msg.local) continue;
        const std::pair<int, int> stream{r, p2p_channel(msg.tag, p2p_channels(s_.shape))};
        const auto it = role.emplace(stream, std::pair{msg.send, msg.peer}).first;
        EXPECT_EQ(it->second, std::pair(msg.send, msg.peer))
            << "rank " << r << " channel " << stream.second << " mixes roles at "
            << format_actions({a}, s_.shape.virtual_stages, true);
      }
  }
  bool done(int r, int mb, int chunk, ActionKind k) const {
    auto it = posted_.find({r, Key{mb, chunk, k}});
    return it == posted_.end() || ops_[it->second].done;
  }
  bool all_sends_done(int r) const {
    for (const Op& op : ops_)
      if (op.rank == r && op.send && !op.done) return false;
    return true;
  }
  // Runs rank r's host until it waits; true if it moved.
  bool advance_host(int r) {
    const auto& acts = s_.ranks[static_cast<size_t>(r)];
    size_t& pc = pc_[static_cast<size_t>(r)];
    bool moved = false;
    while (pc < acts.size()) {
      const Action& a = acts[pc];
      if (is_p2p(a.kind) && p2p_message(s_.shape, r, a).local) {
        // A hand-off within the rank: done when the host reaches it.
      } else if (is_p2p(a.kind)) {
        const P2pMessage msg = p2p_message(s_.shape, r, a);
        const int id = static_cast<int>(ops_.size());
        ops_.push_back({r, msg.send, msg.peer, msg.tag});
        posted_[{r, Key{a.mb, a.chunk, a.kind}}] = id;
        streams_[{r, p2p_channel(msg.tag, p2p_channels(s_.shape))}].push_back(id);
      } else {
        const bool reads_act = a.kind == ActionKind::forward;
        const bool reads_grad =
            a.kind == ActionKind::backward || a.kind == ActionKind::backward_input;
        const bool frees_act =
            a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight;
        const bool first_launch =
            syncing_first_launch_ && !launched_.count({r, static_cast<int>(a.kind)});
        if ((syncing_frees_ && (frees_act || a.kind == ActionKind::backward_input)) || first_launch)
          for (const Op& op : ops_)
            if (op.rank == r && !op.done) return moved;
        if ((reads_act && !done(r, a.mb, a.chunk, ActionKind::recv_act)) ||
            (reads_grad && !done(r, a.mb, a.chunk, ActionKind::recv_grad)) ||
            (frees_act && !done(r, a.mb, a.chunk, ActionKind::send_act)))
          return moved;
        launched_.insert({r, static_cast<int>(a.kind)});
      }
      ++pc;
      moved = true;
    }
    return moved;
  }
  // Completes the calls at the heads of `stream` and its peer's stream when they meet.
  bool match(const std::pair<int, int>& stream) {
    std::deque<int>& q = streams_[stream];
    if (q.empty() || !ops_[q.front()].send) return false;
    Op& send = ops_[q.front()];
    std::deque<int>& peer_q = streams_[{send.peer, stream.second}];
    if (peer_q.empty()) return false;
    Op& recv = ops_[peer_q.front()];
    if (recv.send || recv.peer != send.rank) return false;
    if (recv.tag != send.tag) ++mismatches_;
    send.done = recv.done = true;
    q.pop_front();
    peer_q.pop_front();
    return true;
  }

  const Schedule& s_;
  bool syncing_frees_;
  bool syncing_first_launch_;
  std::set<std::pair<int, int>> launched_;  // (rank, compute action kind) run at least once
  std::vector<size_t> pc_;
  std::vector<Op> ops_;
  std::map<std::pair<int, Key>, int> posted_;               // (rank, key) -> op
  std::map<std::pair<int, int>, std::deque<int>> streams_;  // (rank, channel) -> pending ops
  int mismatches_ = 0;
};

TEST_P(P2pMatching, NcclStreamsMakeProgress) {
  const Schedule s = schedule();
  NcclModel model(s);
  EXPECT_EQ(model.run(), "") << "deadlock";
  EXPECT_EQ(model.mismatches(), 0);
}

// A recorded limit, not a goal: if every backward also waited for all calls its rank posted (the
// device synchronization of cudaFree), the interleaved and ZB-V schedules with m >= 2p would
// deadlock even on separate channels; GPipe, 1F1B and ZB-H1 still finish. This is why the CUDA
// backend frees with cudaFreeAsync on the compute stream, which does not wait (docs/gpu.md).
TEST(P2pMatchingLimits, DeviceSyncingFreesDeadlockInterleavedAndV) {
  for (const Case& c : all_cases()) {
    const Schedule s = make_schedule(c.kind, ScheduleShape{c.p, c.v, c.m});
    NcclModel model(s, /*syncing_frees=*/true);
    const bool deadlocked = !model.run().empty();
    const bool looped = c.kind == PipeSchedule::interleaved || v_shaped(c.kind);
    EXPECT_EQ(deadlocked, looped && c.m >= 2 * c.p) << testing::PrintToString(c);
    EXPECT_EQ(model.mismatches(), 0);
  }
}

// The same for lazy module loading, CUDA's default: the first launch of a kernel may synchronize
// the context (CUDA C++ Programming Guide, "Lazy Loading"), so the first forward, backward,
// backward_input and backward_weight of a rank may wait for every call it posted. Unlike a free
// in every backward, these syncs happen once per kind, early, and every case finishes but ZB-V
// with m >= 2p and DualPipeV from p = 3: rank 0's first Bi (the head's) waits for its activation
// send of a later micro-batch, which rank 1 receives only after its own first Bi, which needs rank
// 0's gradient. So `llmtrain train` asks for eager loading under a V
// (request_eager_module_loading).
TEST(P2pMatchingLimits, FirstLaunchSyncsFinishButInAFullV) {
  for (const Case& c : all_cases()) {
    const Schedule s = make_schedule(c.kind, ScheduleShape{c.p, c.v, c.m});
    NcclModel model(s, /*syncing_frees=*/false, /*syncing_first_launch=*/true);
    const bool deadlocked = !model.run().empty();
    const bool stuck = c.kind == PipeSchedule::zb_v         ? c.m >= 2 * c.p
                       : c.kind == PipeSchedule::dualpipe_v ? c.p >= 3
                                                            : false;
    EXPECT_EQ(deadlocked, stuck) << testing::PrintToString(c);
    EXPECT_EQ(model.mismatches(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, P2pMatching, testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace llmt
