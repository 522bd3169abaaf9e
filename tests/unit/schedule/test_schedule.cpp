// Pipeline schedules checked as data, no model run (issue 6): for every schedule x p in {2,4,8} x
// m in {p,2p,4p}: each backward follows its forward, sends and recvs pair up in order, the
// simulation finishes, and the bubble and peak in-flight micro-batches equal the formulas of
// docs/references.md (ZB-H1: the ZB paper's (p-1)/(3m)). Corrupted schedules must be rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "core/check.h"
#include "engine/schedule/schedule.h"
#include "tests/unit/schedule/schedule_cases.h"

namespace llmt {
namespace {

using detail::concat;
using testing_cases::Case;
using testing_cases::case_name;

std::vector<Case> all_cases() {
  return testing_cases::schedule_cases({2, 4, 8}, {2});
}

// The costs each formula assumes: B = 2F for the undivided backward, Bi = Bw = F for ZB.
const ActionCosts kCosts{};

class ScheduleProps : public testing::TestWithParam<Case> {
 protected:
  Schedule make() const {
    const Case& c = GetParam();
    return make_schedule(c.kind, ScheduleShape{c.p, c.v, c.m});
  }
};

bool is_backward(ActionKind k) {
  return k == ActionKind::backward || k == ActionKind::backward_input;
}

// Checked on the lists alone, independent of simulate(): every (mb, chunk) has one forward, then
// one backward (B, or Bi then Bw), and each p2p action sits next to the compute it serves.
TEST_P(ScheduleProps, EveryBackwardFollowsItsForward) {
  const Schedule s = make();
  const int v = s.shape.virtual_stages, m = s.shape.micro_batches;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    std::map<std::pair<int, int>, std::vector<ActionKind>> seen;
    for (const Action& a : s.ranks[r]) {
      if (a.kind == ActionKind::forward || is_backward(a.kind) ||
          a.kind == ActionKind::backward_weight)
        seen[{a.mb, a.chunk}].push_back(a.kind);
    }
    ASSERT_EQ(seen.size(), static_cast<size_t>(m * v)) << "rank " << r;
    const std::vector<ActionKind> whole{ActionKind::forward, ActionKind::backward},
        split{ActionKind::forward, ActionKind::backward_input, ActionKind::backward_weight};
    for (const auto& [unit, kinds] : seen) {
      // DualPipeV splits some backwards and runs the others whole.
      if (GetParam().kind == PipeSchedule::dualpipe_v && kinds == whole) continue;
      EXPECT_EQ(kinds, splits_backward(GetParam().kind) ? split : whole)
          << "rank " << r << " mb " << unit.first << " chunk " << unit.second;
    }
  }
}

// DDP and ZeRO reduce a chunk's gradients from the step's last action that adds to them (B or Bw)
// on, expecting the later stages' to be final first (their buckets come first): on every rank the
// chunks' last weight-gradient actions run in descending order of their stages.
TEST_P(ScheduleProps, LastWeightGradientsRunLaterStagesFirst) {
  const Schedule s = make();
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    std::map<int, size_t> last;  // stage -> index of its last B or Bw
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight)
        last[stage_of(s.shape, static_cast<int>(r), a.chunk)] = i;
    }
    for (auto it = last.begin(); std::next(it) != last.end(); ++it)
      EXPECT_GT(it->second, std::next(it)->second)
          << "rank " << r << ": stage " << it->first << " before stage " << std::next(it)->first;
  }
}

// For every link (src -> dst, act or grad) the sender's sequence of (mb) equals the receiver's.
TEST_P(ScheduleProps, SendsMatchRecvsInOrder) {
  const Schedule s = make();
  const int p = s.shape.stages;
  using Link = std::tuple<int, int, bool>;  // src, dst, activation (else gradient)
  std::map<Link, std::vector<int>> sent, received;
  size_t sends = 0;
  for (int r = 0; r < p; ++r) {
    for (const Action& a : s.ranks[r]) {
      const int stage = stage_of(s.shape, r, a.chunk);
      // The receiver's (mb, stage) identifies the message; stage = what the receiver runs.
      if (a.kind == ActionKind::send_act) {
        sent[{r, a.peer, true}].push_back(a.mb * 1000 + stage + 1);
        ++sends;
      } else if (a.kind == ActionKind::send_grad) {
        sent[{r, a.peer, false}].push_back(a.mb * 1000 + stage - 1);
        ++sends;
      } else if (a.kind == ActionKind::recv_act) {
        received[{a.peer, r, true}].push_back(a.mb * 1000 + stage);
      } else if (a.kind == ActionKind::recv_grad) {
        received[{a.peer, r, false}].push_back(a.mb * 1000 + stage);
      }
    }
  }
  // Every stage boundary carries m activations forward and m gradients back.
  const int boundaries = p * s.shape.virtual_stages - 1;
  EXPECT_EQ(sends, static_cast<size_t>(2 * boundaries * s.shape.micro_batches));
  EXPECT_EQ(sent, received);
}

TEST_P(ScheduleProps, SimulationMatchesFormulas) {
  const Case& c = GetParam();
  const Schedule s = make();
  const Simulation sim = simulate(s, kCosts);
  const double p = c.p, v = c.v, m = c.m;
  double bubble = (p - 1) / m;                                          // GPipe, 1F1B
  if (c.kind == PipeSchedule::interleaved) bubble = (p - 1) / (v * m);  // Megatron PTD-P
  if (c.kind == PipeSchedule::zb_h1) bubble = (p - 1) / (3 * m);        // ZB paper, F=Bi=Bw
  // ZB-V: only the last rank's wait for its first input, p-1 chunk forwards of half a rank's F.
  // DualPipeV likewise when its F&B pairs run as two actions (the executor's way; the paper's
  // formula for overlapped pairs: DualPipeVIdlesAsThePaperSays).
  if (v_shaped(c.kind)) bubble = (p - 1) / (6 * m);
  if (c.kind == PipeSchedule::zb_v && c.m < 2 * c.p - 2) {
    // Too few micro-batches to fill the V: more idle, still less than ZB-H1's.
    EXPECT_GT(sim.bubble_fraction, bubble + 1e-9);
    EXPECT_LT(sim.bubble_fraction, (p - 1) / (3 * m));
  } else {
    EXPECT_NEAR(sim.bubble_fraction, bubble, 1e-9);
    EXPECT_NEAR(sim.bubble_fraction, formula_bubble_fraction(c.kind, s.shape), 1e-9);
    // Makespan: per rank work m*(F+B) = 3m time units, plus the bubble.
    EXPECT_NEAR(sim.makespan, 3 * m * (1 + bubble), 1e-9);
  }
  ASSERT_EQ(sim.peak_in_flight.size(), static_cast<size_t>(c.p));
  // First stage: 1F1B and ZB-H1 hold p micro-batches, GPipe m (docs/references.md).
  if (c.kind == PipeSchedule::gpipe) {
    EXPECT_EQ(sim.peak_in_flight[0], c.m);
  } else if (c.kind != PipeSchedule::interleaved && !v_shaped(c.kind)) {
    EXPECT_EQ(sim.peak_in_flight[0], c.p);
  }
  for (int r = 0; r < c.p; ++r) {
    int want = c.m;
    if (c.kind == PipeSchedule::one_f_one_b) want = c.p - r;
    if (c.kind == PipeSchedule::zb_h1) want = c.p;
    // (mb, chunk) units: warm-up (p-r-1)*2 + (v-1)*p, plus the one in the steady phase.
    if (c.kind == PipeSchedule::interleaved)
      want = std::min((c.p - r - 1) * 2 + (c.v - 1) * c.p + 1, c.m * c.v);
    // (mb, chunk) units, each half a micro-batch of the rank: at most 2p (p micro-batches, as
    // 1F1B's first stage); fewer while the V fills (m + 1 + r) or with few micro-batches.
    if (c.kind == PipeSchedule::zb_v) want = std::min({2 * c.p, c.m + 1 + r, 2 * c.m});
    // One unit more on every rank: its steady round's forward runs before the paired backward.
    if (c.kind == PipeSchedule::dualpipe_v) want = std::min(2 * c.p + 1, 2 * c.m);
    EXPECT_EQ(sim.peak_in_flight[r], want) << "rank " << r;
    EXPECT_EQ(sim.peak_in_flight[r], formula_peak_in_flight(c.kind, s.shape, r));
  }
}

TEST_P(ScheduleProps, SimulationNeverDeadlocksWithLatency) {
  ActionCosts costs;
  costs.p2p = 0.3;
  costs.backward = 2.5;
  const Simulation sim = simulate(make(), costs);
  EXPECT_GT(sim.makespan, 0);
}

TEST_P(ScheduleProps, SvgHasOneBoxPerComputeAction) {
  const Schedule s = make();
  const Simulation sim = simulate(s, kCosts);
  const std::string svg = schedule_svg(s, sim);
  size_t boxes = 0;
  for (size_t at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1))
    ++boxes;
  size_t computes = 0;
  for (const std::vector<Action>& rank : s.ranks)
    for (const Action& a : rank) computes += is_p2p(a.kind) ? 0 : 1;
  EXPECT_EQ(boxes, computes);
  const int per_unit = splits_backward(GetParam().kind) ? 3 : 2;
  if (GetParam().kind != PipeSchedule::dualpipe_v) {
    EXPECT_EQ(boxes, static_cast<size_t>(per_unit * GetParam().p * GetParam().m * GetParam().v));
  }
  EXPECT_EQ(svg.rfind("</svg>\n"), svg.size() - 7);
}

INSTANTIATE_TEST_SUITE_P(All, ScheduleProps, testing::ValuesIn(all_cases()), case_name);

TEST(Schedule, ZbH1BubbleBelowOneFOneB) {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const double zb = simulate(make_schedule(PipeSchedule::zb_h1, {p, 1, m})).bubble_fraction;
      const double ofob =
          simulate(make_schedule(PipeSchedule::one_f_one_b, {p, 1, m})).bubble_fraction;
      EXPECT_LT(zb, ofob) << "p " << p << " m " << m;
      EXPECT_NEAR(zb * 3, ofob, 1e-9) << "p " << p << " m " << m;
    }
  }
}

// ZB-V against ZB-H1 at the same memory (p micro-batches of a rank's layers in flight): half
// the bubble once m >= 2p-2, a sixth of 1F1B's.
TEST(Schedule, ZbVHalvesZbH1Bubble) {
  for (int p : {2, 3, 4, 8}) {
    for (int m = 2 * p - 2; m <= 4 * p; ++m) {
      if (m < 1) continue;
      const Simulation v = simulate(make_schedule(PipeSchedule::zb_v, {p, 2, m}));
      const double h1 = simulate(make_schedule(PipeSchedule::zb_h1, {p, 1, m})).bubble_fraction;
      EXPECT_NEAR(v.bubble_fraction * 2, h1, 1e-9) << "p " << p << " m " << m;
      EXPECT_EQ(*std::max_element(v.peak_in_flight.begin(), v.peak_in_flight.end()),
                std::min(2 * p, 2 * m))
          << "p " << p << " m " << m;
    }
  }
}

// The V on two ranks, as the executor receives it: rank 0 holds stages 0 and 3 (embeddings and
// head), rank 1 stages 1 and 2, whose turn is a hand-off to itself (sa0.0>1, ra0.1<1).
TEST(Schedule, ZbVWorkedExample) {
  const Schedule s = make_schedule(PipeSchedule::zb_v, {2, 2, 4});
  EXPECT_TRUE(s.shape.v_shape);
  EXPECT_EQ(stage_of(s.shape, 0, 1), 3);
  EXPECT_EQ(stage_of(s.shape, 1, 1), 2);
  EXPECT_EQ(rank_of(s.shape, 2), 1);
  EXPECT_EQ(format_actions(s.ranks[0], 2),
            "F0.0 F1.0 F2.0 F0.1 Bi0.1 Bw0.1 F1.1 Bi1.1 Bw1.1 F3.0 Bi0.0 Bw0.0 F2.1 Bi2.1 Bw2.1 "
            "Bi1.0 Bw1.0 F3.1 Bi3.1 Bw3.1 Bi2.0 Bw2.0 Bi3.0 Bw3.0");
  EXPECT_EQ(format_actions(s.ranks[1], 2),
            "F0.0 F0.1 F1.0 F1.1 Bi0.1 Bw0.1 F2.0 Bi0.0 Bw0.0 F2.1 Bi1.1 Bw1.1 F3.0 Bi1.0 Bw1.0 "
            "F3.1 Bi2.1 Bw2.1 Bi2.0 Bi3.1 Bi3.0 Bw2.0 Bw3.1 Bw3.0");
  const std::string p2p = format_actions(s.ranks[1], 2, true);
  EXPECT_EQ(p2p.substr(0, 36), "ra0.0<0 F0.0 sa0.0>1 ra0.1<1 F0.1 sa");
  EXPECT_NE(p2p.find("Bi0.1 sg0.1>1 Bw0.1"), std::string::npos) << p2p;
  const P2pMessage turn = p2p_message(s.shape, 1, s.ranks[1][2]);
  EXPECT_TRUE(turn.local);
  EXPECT_EQ(p2p_channels(s.shape), 8);
  EXPECT_THROW(make_schedule(PipeSchedule::zb_v, {2, 1, 4}), Error);
}

// DualPipeV (DeepSeek's DualPipe README, "Pipeline Bubbles and Memory Usage"): a rank idles
// (PP/2-1)(F&B + B - 3W) for PP = 2p stages, with F, B, W one chunk's forward, full backward and
// weight half and F&B the time of an overlapped pair, and holds PP+1 = 2p+1 chunk units of
// activations. Checked with the pairs timed as one block, overlapped or not, on the rank that
// idles most, from the fewest micro-batches it runs (2p-1) up; run as two actions (the executor)
// the pairs idle as ZB-V does, (p-1) F.
TEST(Schedule, DualPipeVIdlesAsThePaperSays) {
  for (int p : {2, 3, 4, 8}) {
    for (int m = 2 * p - 1; m <= 4 * p; ++m) {
      const Schedule s = make_schedule(PipeSchedule::dualpipe_v, {p, 2, m});
      for (double pair : {3.0, 2.4, 2.0, 0.0}) {  // a rank's F + B = 3: no overlap, some, most
        ActionCosts costs;
        costs.forward_backward = pair;
        const Simulation sim = simulate(s, costs);
        const double idle = *std::max_element(sim.idle.begin(), sim.idle.end());
        for (size_t r = 0; r < sim.ranks.size(); ++r) {  // (idle: what no action covers)
          double busy = 0;
          for (const TimedAction& t : sim.ranks[r]) busy += t.end - t.start;
          EXPECT_NEAR(sim.idle[r], sim.makespan - busy, 1e-9);
        }
        const double F = costs.forward / 2, B = costs.backward / 2, W = costs.backward_weight / 2;
        const double want = pair > 0 ? (p - 1) * (pair / 2 + B - 3 * W) : (p - 1) * F;
        EXPECT_NEAR(idle, want, 1e-9) << "p " << p << " m " << m << " F&B " << pair;
        EXPECT_EQ(*std::max_element(sim.peak_in_flight.begin(), sim.peak_in_flight.end()),
                  2 * p + 1)
            << "p " << p << " m " << m;
      }
    }
  }
}

// parallel.pp_max_deferred = K on the zero-bubble schedules: no rank holds more than K weight
// halves waiting between its backward steps before its step's last backward of chunk 0 (K + 1
// after, so that chunk 1's gradients are final first; ZB-H1 and ZB-V run the oldest right after
// the input half that makes K + 1, DualPipeV splits no more backwards: at K = 0 none at all). The
// bubble grows as K shrinks, staying below 1F1B's (p-1)/m, and DualPipeV's from K = 1 on at most
// ZB-H1's (p-1)/(3m). Other schedules refuse K.
TEST(Schedule, ZeroBubbleDefersAtMostItsCap) {
  for (PipeSchedule kind : {PipeSchedule::zb_h1, PipeSchedule::zb_v, PipeSchedule::dualpipe_v}) {
    const int v = v_shaped(kind) ? 2 : 1;
    for (int p : {2, 4, 8}) {
      for (int m : {2 * p - 1, 2 * p, 4 * p}) {
        const std::string at = concat(schedule_name(kind), " p ", p, " m ", m);
        double looser = simulate(make_schedule(kind, {p, v, m})).bubble_fraction;
        const Simulation uncapped = simulate(make_schedule(kind, {p, v, m}));
        for (int cap : {4, 2, 1, 0}) {
          const Schedule s = make_schedule(kind, {p, v, m, false, cap});
          for (size_t r = 0; r < s.ranks.size(); ++r) {
            // (as LastWeightGradientsRunLaterStagesFirst: chunk 1's last before chunk 0's)
            size_t last[2] = {0, 0};
            for (size_t i = 0; i < s.ranks[r].size(); ++i)
              if (s.ranks[r][i].kind == ActionKind::backward ||
                  s.ranks[r][i].kind == ActionKind::backward_weight)
                last[s.ranks[r][i].chunk] = i;
            EXPECT_TRUE(v == 1 || last[0] > last[1]) << at << " cap " << cap << " rank " << r;
            int waiting = 0, most = 0, split = 0;
            bool ending = false;
            for (const Action& a : s.ranks[r]) {
              ending = ending || (a.chunk == 0 && a.mb == m - 1 && a.kind != ActionKind::forward);
              waiting += a.kind == ActionKind::backward_input    ? 1
                         : a.kind == ActionKind::backward_weight ? -1
                                                                 : 0;
              split += a.kind == ActionKind::backward_input && !ending;
              // (Counted between backward steps: ZB-H1 and ZB-V run the oldest weight half right
              // after an input half that makes K + 1, as ZB-H1's rank r runs its (r+1)-th.)
              if (!ending && a.kind != ActionKind::backward_input && !is_p2p(a.kind))
                most = std::max(most, waiting);
              EXPECT_LE(waiting, cap + 1) << at;
            }
            EXPECT_LE(most, cap) << at << " cap " << cap << " rank " << r;
            if (kind == PipeSchedule::dualpipe_v) {
              EXPECT_TRUE(cap > 0 || split == 0) << at << " rank " << r;
            }
          }
          const Simulation sim = simulate(s);
          EXPECT_GE(sim.bubble_fraction, looser - 1e-12) << at << " cap " << cap;
          EXPECT_LT(sim.bubble_fraction, (p - 1.0) / m) << at << " cap " << cap;
          if (kind == PipeSchedule::dualpipe_v && cap > 0) {
            EXPECT_LE(sim.bubble_fraction, (p - 1.0) / (3 * m) + 1e-12) << at << " cap " << cap;
          }
          for (int r = 0; r < p; ++r)
            EXPECT_LE(sim.peak_in_flight[r], uncapped.peak_in_flight[r]) << at << " cap " << cap;
          looser = sim.bubble_fraction;
        }
      }
    }
  }
  EXPECT_THROW(make_schedule(PipeSchedule::one_f_one_b, {2, 1, 4, false, 1}), Error);
  EXPECT_THROW(make_schedule(PipeSchedule::interleaved, {2, 2, 4, false, 1}), Error);
  EXPECT_THROW(make_schedule(PipeSchedule::dualpipe_v, {2, 2, 4, false, -2}), Error);
}

// DualPipeV on two ranks, m = 4: rank r runs 2(p-r-1) forwards of chunk 0, r+1 pairs F0 F1,
// p-r-1 rounds Bi1 Bw F1, then the F&B rounds F0 B1 F1 B0 (the pairs `paired`), B1 F1 B0, the
// drain B1 B0 split from its middle round, Bw Bi0, and the weight halves left, oldest first.
TEST(Schedule, DualPipeVWorkedExample) {
  const Schedule s = make_schedule(PipeSchedule::dualpipe_v, {2, 2, 4});
  EXPECT_TRUE(s.shape.v_shape);
  EXPECT_EQ(format_actions(s.ranks[0], 2),
            "F0.0 F1.0 F2.0 F0.1 Bi0.1 Bw0.1 F1.1 F3.0 B1.1 F2.1 B0.0 B2.1 F3.1 B1.0 B3.1 Bi2.0 "
            "Bw2.0 Bi3.0 Bw3.0");
  EXPECT_EQ(format_actions(s.ranks[1], 2),
            "F0.0 F0.1 F1.0 F1.1 F2.0 B0.1 F2.1 B0.0 F3.0 B1.1 F3.1 B1.0 B2.1 B2.0 Bi3.1 Bi3.0 "
            "Bw3.1 Bw3.0");
  int pairs = 0;
  for (const Action& a : s.ranks[1]) pairs += a.paired;
  EXPECT_EQ(pairs, 3);  // the last rank's first round is two actions
  for (int m : {1, 2}) {
    try {
      make_schedule(PipeSchedule::dualpipe_v, {2, 2, m});
      FAIL() << "no error at m " << m;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(concat("micro_batches=", m, ", stages=2")),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(make_schedule(PipeSchedule::dualpipe_v, {2, 1, 4}), Error);
}

TEST(Schedule, SingleStageHasNoBubble) {
  for (PipeSchedule kind :
       {PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::interleaved,
        PipeSchedule::zb_h1, PipeSchedule::zb_v, PipeSchedule::dualpipe_v}) {
    const int v = kind == PipeSchedule::interleaved || v_shaped(kind) ? 2 : 1;
    const Simulation sim = simulate(make_schedule(kind, {1, v, 3}));
    EXPECT_EQ(sim.bubble_fraction, 0) << schedule_name(kind);
    EXPECT_EQ(sim.makespan, 9) << schedule_name(kind);
  }
}

// Worked example p=2, m=3: the exact lists the executor will receive.
TEST(Schedule, OneFOneBWorkedExample) {
  const Schedule s = make_schedule(PipeSchedule::one_f_one_b, {2, 1, 3});
  EXPECT_EQ(format_actions(s.ranks[0], 1), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(format_actions(s.ranks[1], 1), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(format_actions(s.ranks[0], 1, true),
            "F0 sa0>1 F1 sa1>1 rg0<1 B0 F2 sa2>1 rg1<1 B1 rg2<1 B2");
  EXPECT_EQ(format_actions(s.ranks[1], 1, true),
            "ra0<0 F0 B0 sg0>0 ra1<0 F1 B1 sg1>0 ra2<0 F2 B2 sg2>0");
}

TEST(Schedule, InterleavedWrapsAroundAndSuffixesChunks) {
  const Schedule s = make_schedule(PipeSchedule::interleaved, {2, 2, 2});
  // Stage 1 (rank 1, chunk 0) sends to stage 2 (rank 0, chunk 1).
  const Action first_send = s.ranks[1][2];
  EXPECT_EQ(first_send, (Action{ActionKind::send_act, 0, 0, 0}));
  EXPECT_EQ(format_actions(s.ranks[0], 2), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

TEST(Schedule, ZbH1WorkedExample) {
  // p=2, m=4: rank 1 (last) defers one Bw; rank 0 none.
  const Schedule s = make_schedule(PipeSchedule::zb_h1, {2, 1, 4});
  EXPECT_EQ(format_actions(s.ranks[0], 1), "F0 F1 Bi0 Bw0 F2 Bi1 Bw1 F3 Bi2 Bw2 Bi3 Bw3");
  EXPECT_EQ(format_actions(s.ranks[1], 1), "F0 Bi0 F1 Bi1 Bw0 F2 Bi2 Bw1 F3 Bi3 Bw2 Bw3");
}

TEST(Schedule, ShapeErrorsNameTheNumbers) {
  try {
    make_schedule(PipeSchedule::interleaved, {4, 2, 6});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro_batches=6, stages=4"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_schedule(PipeSchedule::one_f_one_b, {4, 2, 8}), Error);
  EXPECT_THROW(make_schedule(PipeSchedule::gpipe, {0, 1, 8}), Error);
}

// The simulator must reject broken schedules, naming the rank and the action.
std::string simulate_error(const Schedule& s) {
  try {
    simulate(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

size_t find_action(const std::vector<Action>& list, ActionKind kind, int mb) {
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == kind && list[i].mb == mb) return i;
  ADD_FAILURE() << "no " << action_name(kind) << mb;
  return 0;
}

TEST(ScheduleCorrupted, DroppedRecvIsCaught) {
  Schedule s = make_schedule(PipeSchedule::one_f_one_b, {4, 1, 8});
  auto& r2 = s.ranks[2];
  r2.erase(r2.begin() + find_action(r2, ActionKind::recv_act, 3));
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("rank 2 action #"), std::string::npos) << err;
  EXPECT_NE(err.find("F(mb 3, chunk 0): runs before the recv_act"), std::string::npos) << err;
}

TEST(ScheduleCorrupted, DroppedSendDeadlocks) {
  Schedule s = make_schedule(PipeSchedule::gpipe, {4, 1, 4});
  auto& r1 = s.ranks[1];
  r1.erase(r1.begin() + find_action(r1, ActionKind::send_act, 3));
  // Rank 2: ra0 F0 sa0 ra1 F1 sa1 ra2 F2 sa2 ra3 ...: stuck at #9 for good.
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("deadlocks; rank 0 waits at"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 2 waits at action #9 recv_act(mb 3, chunk 0) from rank 1"),
            std::string::npos)
      << err;
}

TEST(ScheduleCorrupted, DroppedSendOfEarlierMicroBatchIsCaught) {
  Schedule s = make_schedule(PipeSchedule::gpipe, {4, 1, 4});
  auto& r1 = s.ranks[1];
  r1.erase(r1.begin() + find_action(r1, ActionKind::send_act, 0));
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("rank 2 action #0 recv_act(mb 0, chunk 0) from rank 1: the next message on "
                     "that link is for (mb 1, chunk 0)"),
            std::string::npos)
      << err;
}

TEST(ScheduleCorrupted, BackwardBeforeForwardIsCaught) {
  Schedule s = make_schedule(PipeSchedule::gpipe, {2, 1, 2});
  auto& r1 = s.ranks[1];  // last stage: F0 then B0 with no recv in between
  const size_t f = find_action(r1, ActionKind::forward, 1);
  const size_t b = find_action(r1, ActionKind::backward, 1);
  std::swap(r1[f], r1[b]);
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("rank 1 action #" + std::to_string(f) +
                     " B(mb 1, chunk 0): runs before its "
                     "forward"),
            std::string::npos)
      << err;
}

TEST(ScheduleCorrupted, SwappedComputeOrderDeadlocks) {
  // p=2, m=2, 1F1B. Rank 0 waits for the gradient of mb 0 before it sends F1, while rank 1 wants
  // F1 before it runs B0: a cycle.
  Schedule s = make_schedule(PipeSchedule::one_f_one_b, {2, 1, 2});
  auto& r0 = s.ranks[0];  // F0 sa0 F1 sa1 rg0 B0 rg1 B1 -> F0 sa0 rg0 B0 F1 sa1 rg1 B1
  const size_t f1 = find_action(r0, ActionKind::forward, 1);
  const size_t rg0 = find_action(r0, ActionKind::recv_grad, 0);
  std::rotate(r0.begin() + f1, r0.begin() + rg0, r0.begin() + rg0 + 2);
  auto& r1 = s.ranks[1];  // ra0 F0 B0 sg0 ra1 F1 B1 sg1 -> ra0 F0 ra1 F1 B0 sg0 B1 sg1
  const size_t b0 = find_action(r1, ActionKind::backward, 0);
  const size_t ra1 = find_action(r1, ActionKind::recv_act, 1);
  std::rotate(r1.begin() + b0, r1.begin() + ra1, r1.begin() + ra1 + 2);
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("deadlocks; rank 0 waits at action #2 recv_grad(mb 0, chunk 0) from rank 1"),
            std::string::npos)
      << err;
}

TEST(ScheduleCorrupted, RecvOrderSwapIsCaught) {
  Schedule s = make_schedule(PipeSchedule::gpipe, {2, 1, 2});
  auto& r1 = s.ranks[1];  // ra0 F0 ra1 F1 ...: receive mb 1 first
  const size_t ra0 = find_action(r1, ActionKind::recv_act, 0);
  const size_t ra1 = find_action(r1, ActionKind::recv_act, 1);
  std::swap(r1[ra0], r1[ra1]);
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("rank 1 action #0 recv_act(mb 1, chunk 0) from rank 0: the next message on "
                     "that link is for (mb 0, chunk 0)"),
            std::string::npos)
      << err;
}

TEST(ScheduleCorrupted, WrongPeerIsCaught) {
  Schedule s = make_schedule(PipeSchedule::one_f_one_b, {4, 1, 4});
  s.ranks[1][find_action(s.ranks[1], ActionKind::send_act, 2)].peer = 3;
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("send_act(mb 2, chunk 0) to rank 3: the peer must be rank 2"),
            std::string::npos)
      << err;
}

// ZB-V's last weight halves swapped (chunk 0's before chunk 1's on rank 1): the later stage's
// gradients would be reduced before their last micro-batch's part (the capped DualPipeV bug).
TEST(ScheduleCorrupted, GradientsReducedOutOfOrderAreCaught) {
  Schedule s = make_schedule(PipeSchedule::zb_v, {2, 2, 4});
  auto& r1 = s.ranks[1];
  size_t last[2] = {0, 0};
  for (size_t i = 0; i < r1.size(); ++i)
    if (r1[i].kind == ActionKind::backward_weight) last[r1[i].chunk] = i;
  std::swap(r1[last[0]], r1[last[1]]);
  EXPECT_EQ(gradient_order_error(s, 0), "");
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("rank 1 runs its last weight-gradient action of stage 1 (#"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("before that of the later stage 2"), std::string::npos) << err;
}

TEST(ScheduleCorrupted, MissingWeightGradientIsCaught) {
  Schedule s = make_schedule(PipeSchedule::zb_h1, {4, 1, 8});
  auto& r3 = s.ranks[3];
  r3.erase(r3.begin() + find_action(r3, ActionKind::backward_weight, 5));
  const std::string err = simulate_error(s);
  EXPECT_NE(err.find("rank 3 never runs the whole backward of (mb 5, chunk 0)"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace llmt
