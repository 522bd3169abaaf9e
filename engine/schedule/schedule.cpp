// Schedule generators, the event-driven simulator and the SVG timeline (schedule.h). Each
// generator first orders each rank's compute actions; with_p2p then adds the sends and recvs
// around them, so every schedule follows one convention: a recv right before the compute that
// needs it, a send right after the compute that produces it.
#include "engine/schedule/schedule.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "core/check.h"

namespace llmt {

using detail::concat;

namespace {

Action compute(ActionKind kind, int mb, int chunk = 0) {
  return Action{kind, mb, chunk, -1};
}

bool is_compute(ActionKind k) {
  return k == ActionKind::forward || k == ActionKind::backward || k == ActionKind::backward_input ||
         k == ActionKind::backward_weight;
}

// "F(mb 3, chunk 1)", or "recv_act(mb 3, chunk 1) from rank 2": for error messages.
std::string describe(const Action& a) {
  std::string s = concat(action_name(a.kind), "(mb ", a.mb, ", chunk ", a.chunk, ")");
  if (a.kind == ActionKind::send_act || a.kind == ActionKind::send_grad) {
    s += concat(" to rank ", a.peer);
  } else if (a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad) {
    s += concat(" from rank ", a.peer);
  }
  return s;
}

// Rank r's compute actions, in order, for one schedule: ranks[r] = [F/B/Bi/Bw ...].
using ComputeOrder = std::vector<std::vector<Action>>;

// GPipe: all m forwards, then all m backwards, micro-batches in order.
ComputeOrder gpipe(const ScheduleShape& s) {
  ComputeOrder out(s.stages);
  for (int r = 0; r < s.stages; ++r) {
    for (int mb = 0; mb < s.micro_batches; ++mb) out[r].push_back(compute(ActionKind::forward, mb));
    for (int mb = 0; mb < s.micro_batches; ++mb)
      out[r].push_back(compute(ActionKind::backward, mb));
  }
  return out;
}

// 1F1B (PipeDream-Flush): rank r runs p-r-1 warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards. At most p-r micro-batches are alive on rank r.
ComputeOrder one_f_one_b(const ScheduleShape& s) {
  const int p = s.stages, m = s.micro_batches;
  ComputeOrder out(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, m);
    int f = 0, b = 0;
    while (f < warmup) out[r].push_back(compute(ActionKind::forward, f++));
    while (f < m) {
      out[r].push_back(compute(ActionKind::forward, f++));
      out[r].push_back(compute(ActionKind::backward, b++));
    }
    while (b < m) out[r].push_back(compute(ActionKind::backward, b++));
  }
  return out;
}

// Interleaved 1F1B (Megatron PTD-P, Narayanan et al. 2021): the m*v (micro-batch, chunk) units are
// taken in groups of p micro-batches per chunk: forward unit k is micro-batch (k / (p*v)) * p +
// k % p of chunk (k / p) % v; backward unit k the same micro-batch of chunk v-1 - (k / p) % v.
// Rank r runs (p-r-1)*2 + (v-1)*p warm-up forwards, then one forward and one backward at a time.
ComputeOrder interleaved(const ScheduleShape& s) {
  const int p = s.stages, v = s.virtual_stages, m = s.micro_batches, units = m * v;
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd = [&](int k) { return compute(ActionKind::forward, mb_of(k), (k / p) % v); };
  auto bwd = [&](int k) { return compute(ActionKind::backward, mb_of(k), v - 1 - (k / p) % v); };
  ComputeOrder out(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, units);
    int f = 0, b = 0;
    while (f < warmup) out[r].push_back(fwd(f++));
    while (f < units) {
      out[r].push_back(fwd(f++));
      out[r].push_back(bwd(b++));
    }
    while (b < units) out[r].push_back(bwd(b++));
  }
  return out;
}

// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", handcrafted schedule 1): 1F1B with
// the backward split into Bi (input gradient, on the critical path) and Bw (weight gradient).
// Rank r keeps r weight-gradient parts pending: in the steady phase each Bi is followed by the Bw
// of r micro-batches earlier, and the pending ones fill the cool-down. Rank r then holds at most
// (p-r-1) + 1 + r = p micro-batches, 1F1B's peak (its first stage), and with F = Bi = Bw the
// bubble shrinks from 1F1B's 3(p-1) time units to p-1. With max_deferred = K rank r keeps
// min(r, K) pending.
ComputeOrder zb_h1(const ScheduleShape& s) {
  const int p = s.stages, m = s.micro_batches;
  ComputeOrder out(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, m);
    int f = 0, b = 0, w = 0;
    // (max_deferred = K: at most min(r, K) weight halves wait.)
    const int keep = s.max_deferred < 0 ? r : std::min(r, s.max_deferred);
    auto backward = [&] {
      out[r].push_back(compute(ActionKind::backward_input, b++));
      if (b - w > keep) out[r].push_back(compute(ActionKind::backward_weight, w++));
    };
    while (f < warmup) out[r].push_back(compute(ActionKind::forward, f++));
    while (f < m) {
      out[r].push_back(compute(ActionKind::forward, f++));
      backward();
    }
    while (b < m) backward();
    while (w < m) out[r].push_back(compute(ActionKind::backward_weight, w++));
  }
  return out;
}

// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", the V schedule): 2p stages over p ranks,
// rank r holding stage r (chunk 0) and stage 2p-1-r (chunk 1), so a micro-batch's forward runs
// down the ranks on chunk 0 and back up on chunk 1, and rank 0 ends it with the loss. With F = Bi
// = Bw per chunk, rank r starts at time r and its first chunk-1 input arrives after 2(p-r)-1 of
// its chunk-0 forwards; it then alternates the two chunks' forwards until the first output
// gradient comes back (r pairs), runs p-r rounds of chunk 1's F, Bi, Bw (rank 0, the last stage,
// turns each forward into its backward at once), then the steady round F Bi Bw on chunk 0 and on
// chunk 1, and drains the input gradients left before the deferred weight gradients. At most 2p
// (mb, chunk) units are alive on a rank: p micro-batches of its layers, 1F1B's first-stage peak.
// With max_deferred = K the oldest weight half runs right after an input half that makes K + 1
// wait (not after the step's last one of chunk 0, whose weight half runs after chunk 1's).
ComputeOrder zb_v(const ScheduleShape& s) {
  const int p = s.stages, m = s.micro_batches;
  ComputeOrder out(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& o = out[r];
    int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
    std::deque<int> waiting;  // the chunks of the weight halves not run yet, oldest first
    // Each step runs when its unit exists: a forward of chunk 1 only after chunk 0's of that
    // micro-batch, a backward only after its forward.
    auto F = [&](int c) {
      if (f[c] < m && (c == 0 || f[1] < f[0])) o.push_back(compute(ActionKind::forward, f[c]++, c));
    };
    // (Chunk 0's last weight half runs after every one of chunk 1: DDP and ZeRO reduce a chunk's
    // gradients from its last one on, the later stages' first; see dualpipe_v.)
    auto Bw = [&](int c) {
      if (w[c] >= b[c] || (c == 0 && w[0] == m - 1 && w[1] < m)) return false;
      o.push_back(compute(ActionKind::backward_weight, w[c]++, c));
      waiting.erase(std::find(waiting.begin(), waiting.end(), c));
      return true;
    };
    // max_deferred = K: past K waiting, the oldest runs right away, but after the step's last
    // input half of chunk 0 (chunk 1's gradients must be final first: see dualpipe_v).
    const size_t cap = s.max_deferred < 0 ? std::numeric_limits<size_t>::max()
                                          : static_cast<size_t>(s.max_deferred);
    auto Bi = [&](int c) {
      if (b[c] >= f[c] || (c == 0 && b[0] >= b[1])) return;
      o.push_back(compute(ActionKind::backward_input, b[c]++, c));
      waiting.push_back(c);
      if (c == 0 && b[0] == m) return;
      while (waiting.size() > cap && Bw(waiting.front())) {
      }
    };
    for (int k = 0; k < 2 * (p - r) - 1; ++k) F(0);
    for (int k = 0; k < r; ++k) {
      F(1);
      F(0);
    }
    for (int k = 0; k < p - r; ++k) {
      F(1);
      Bi(1);
      Bw(1);
    }
    while (f[1] < m) {
      F(0);
      Bi(0);
      Bw(0);
      F(1);
      Bi(1);
      Bw(1);
    }
    while (b[1] < m) {
      Bi(0);
      Bi(1);
    }
    while (b[0] < m) {
      Bi(0);
      Bw(0);
    }
    while (w[1] < m) Bw(1);
    while (w[0] < m) Bw(0);
  }
  return out;
}

// DualPipeV (DeepSeek's DualPipe cut in half: the V of ZB-V, Sea AI Lab's "cut-in-half"; the
// order of deepseek-ai/DualPipe's dualpipev.py): the same stages as ZB-V, but the steady phase
// pairs the forward of one micro-batch with the full backward of another (F0 B1 F1 B0 per round,
// each pair one "F&B" the paper overlaps: one micro-batch's communication behind the other's
// compute), and only the warm-up's chunk-1 backwards, the last rank's (r+1)-th of the drain on,
// and chunk 0's drain split off their weight gradients, which run in the order their input halves
// ran (a queue, as the paper's WeightGradStore). Rank r: 2(p-r-1) forwards of chunk 0; r+1
// pairs F0 F1; p-r-1 rounds Bi1 Bw F1; m-2p+r+1 rounds F0 B1 F1 B0; p-r-1 rounds B1 F1 B0; r+1
// rounds B1 B0 (split from the middle one on); p-r-1 rounds Bw Bi0; r+1 Bw. Needs m >= 2p-1
// (rank 0's steady rounds are m-2p+1). At most 2p+1 (mb, chunk) units are alive on a rank.
// With max_deferred = K a backward splits only while fewer than K weight halves wait (the others
// run whole), which bounds the stashes a rank holds at K at the price of some bubble (K + 1 from
// the step's last chunk-0 backward on: see B below).
ComputeOrder dualpipe_v(const ScheduleShape& s) {
  const int p = s.stages, m = s.micro_batches;
  ComputeOrder out(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& o = out[r];
    int f[2] = {0, 0}, b[2] = {0, 0};
    std::deque<Action> weights;  // the split backwards' weight halves, oldest first
    auto F = [&](int c, bool paired = false) {
      o.push_back(compute(ActionKind::forward, f[c]++, c));
      o.back().paired = paired;
    };
    const size_t cap = s.max_deferred < 0 ? std::numeric_limits<size_t>::max()
                                          : static_cast<size_t>(s.max_deferred);
    auto W = [&] {  // (none waits where the cap kept the backward whole)
      if (weights.empty()) return;
      o.push_back(weights.front());
      weights.pop_front();
    };
    auto B = [&](int c, bool split) {
      // DDP and ZeRO reduce a chunk's gradients once its step's last weight part has run, the
      // later stages' (chunk 1's) first: the last backward of chunk 0 splits while weight halves
      // wait (its own joins the queue behind them), over the cap if need be.
      const bool last0 = c == 0 && b[0] == m - 1 && !weights.empty();
      split = (split && weights.size() < cap) || last0;
      o.push_back(compute(split ? ActionKind::backward_input : ActionKind::backward, b[c]++, c));
      if (split) weights.push_back(compute(ActionKind::backward_weight, o.back().mb, c));
    };
    for (int k = 0; k < 2 * (p - r - 1); ++k) F(0);
    for (int k = 0; k < r + 1; ++k) {
      F(0);
      F(1);
    }
    for (int k = 0; k < p - r - 1; ++k) {
      B(1, true);
      W();
      F(1);
    }
    // (The last rank's first round is two actions, not a pair, as DualPipe's: a shorter bubble.)
    for (int k = 0; k < m - 2 * p + r + 1; ++k) {
      F(0, k > 0 || r < p - 1);
      B(1, false);
      F(1, true);
      B(0, false);
    }
    for (int k = 0; k < p - r - 1; ++k) {
      B(1, false);
      F(1, true);
      B(0, false);
    }
    // From the middle round of the drain on the backwards split (an odd rank's from that round's
    // chunk 1, an even rank's from its chunk 0), so the weight halves fill the ranks' tails.
    const int mid = (r + 1) / 2;
    for (int k = 0; k < r + 1; ++k) {
      B(1, k > mid || (k == mid && r % 2 == 1));
      B(0, k >= mid);
    }
    for (int k = 0; k < p - r - 1; ++k) {
      W();
      B(0, true);
    }
    while (!weights.empty()) W();
  }
  return out;
}

// Adds the p2p actions around rank r's compute actions: recv_act before a forward that is not on
// stage 0, send_act after it unless on the last stage; recv_grad before a backward (B or Bi) that
// is not on the last stage, send_grad after it unless on stage 0.
std::vector<Action> with_p2p(const ScheduleShape& s, int r, const std::vector<Action>& order) {
  const int last = s.stages * s.virtual_stages - 1;
  std::vector<Action> out;
  out.reserve(order.size() * 3);
  for (const Action& a : order) {
    const int stage = stage_of(s, r, a.chunk);
    const int prev_rank = rank_of(s, std::max(stage - 1, 0)), next_rank = rank_of(s, stage + 1);
    if (a.kind == ActionKind::forward) {
      if (stage > 0) out.push_back({ActionKind::recv_act, a.mb, a.chunk, prev_rank});
      out.push_back(a);
      if (stage < last) out.push_back({ActionKind::send_act, a.mb, a.chunk, next_rank});
    } else if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input) {
      if (stage < last) out.push_back({ActionKind::recv_grad, a.mb, a.chunk, next_rank});
      out.push_back(a);
      if (stage > 0) out.push_back({ActionKind::send_grad, a.mb, a.chunk, prev_rank});
    } else {
      out.push_back(a);
    }
  }
  return out;
}

double cost_of(const ActionCosts& c, ActionKind k) {
  switch (k) {
    case ActionKind::forward:
      return c.forward;
    case ActionKind::backward:
      return c.backward;
    case ActionKind::backward_input:
      return c.backward_input;
    case ActionKind::backward_weight:
      return c.backward_weight;
    default:
      return 0;
  }
}

}  // namespace

const char* schedule_name(PipeSchedule kind) {
  switch (kind) {
    case PipeSchedule::gpipe:
      return "gpipe";
    case PipeSchedule::one_f_one_b:
      return "1f1b";
    case PipeSchedule::interleaved:
      return "interleaved";
    case PipeSchedule::zb_h1:
      return "zb-h1";
    case PipeSchedule::zb_v:
      return "zb-v";
    case PipeSchedule::dualpipe_v:
      return "dualpipev";
  }
  return "?";
}

const char* action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward:
      return "F";
    case ActionKind::backward:
      return "B";
    case ActionKind::backward_input:
      return "Bi";
    case ActionKind::backward_weight:
      return "Bw";
    case ActionKind::send_act:
      return "send_act";
    case ActionKind::recv_act:
      return "recv_act";
    case ActionKind::send_grad:
      return "send_grad";
    case ActionKind::recv_grad:
      return "recv_grad";
  }
  return "?";
}

namespace {
// Colours of the pp ranks: neighbours differ, also across the ring p-1 -> 0 of interleaving.
bool odd_ring(const ScheduleShape& s) {
  return s.virtual_stages > 1 && !s.v_shape && s.stages % 2 == 1;
}
int colour(const ScheduleShape& s, int rank) {
  return odd_ring(s) && rank == s.stages - 1 ? 2 : rank % 2;
}
}  // namespace

int p2p_channels(const ScheduleShape& s) {
  return s.v_shape ? 8 : odd_ring(s) ? 6 : 4;
}

int p2p_tag(const ScheduleShape& s, int mb, int recv_stage, bool grad) {
  const int stages = s.stages * s.virtual_stages;
  const int sender = rank_of(s, ((grad ? recv_stage + 1 : recv_stage - 1) + stages) % stages);
  const bool down = s.v_shape && sender > rank_of(s, recv_stage);
  const int channel = (grad ? 1 : 0) + 2 * colour(s, sender) + (down ? 4 : 0);
  return (mb * stages + recv_stage) * p2p_channels(s) + channel;
}

bool is_p2p(ActionKind kind) {
  return kind == ActionKind::send_act || kind == ActionKind::recv_act ||
         kind == ActionKind::send_grad || kind == ActionKind::recv_grad;
}

P2pMessage p2p_message(const ScheduleShape& s, int rank, const Action& a) {
  const int stage = stage_of(s, rank, a.chunk);
  const bool local = a.peer == rank;
  switch (a.kind) {
    case ActionKind::recv_act:
      return {false, a.peer, p2p_tag(s, a.mb, stage, false), local};
    case ActionKind::send_act:
      return {true, a.peer, p2p_tag(s, a.mb, stage + 1, false), local};
    case ActionKind::recv_grad:
      return {false, a.peer, p2p_tag(s, a.mb, stage, true), local};
    case ActionKind::send_grad:
      return {true, a.peer, p2p_tag(s, a.mb, stage - 1, true), local};
    default:
      break;
  }
  throw Error(concat("p2p_message: ", action_name(a.kind), " of micro-batch ", a.mb,
                     " is not a send or receive"));
}

Schedule make_schedule(PipeSchedule kind, const ScheduleShape& requested) {
  ScheduleShape shape = requested;
  shape.v_shape = v_shaped(kind);
  const int p = shape.stages, v = shape.virtual_stages, m = shape.micro_batches;
  if (p < 1 || v < 1 || m < 1)
    throw Error(concat("pipeline schedule ", schedule_name(kind), ": stages=", p,
                       ", virtual_stages=", v, ", micro_batches=", m, " must all be >= 1"));
  if (shape.v_shape && v != 2)
    throw Error(concat("pipeline schedule ", schedule_name(kind),
                       " runs two model chunks per rank (a V): ", "virtual_stages=", v,
                       " must be 2"));
  if (kind != PipeSchedule::interleaved && !shape.v_shape && v != 1)
    throw Error(concat("pipeline schedule ", schedule_name(kind),
                       " runs one model chunk per rank: ", "virtual_stages=", v,
                       " needs the interleaved schedule"));
  if (kind == PipeSchedule::interleaved && m % p != 0)
    throw Error(concat("pipeline schedule interleaved needs micro_batches divisible by stages: ",
                       "micro_batches=", m, ", stages=", p, " (use a multiple of ", p, ")"));
  if (shape.max_deferred < -1 || (shape.max_deferred != -1 && !splits_backward(kind)))
    throw Error(
        concat("pipeline schedule ", schedule_name(kind), ": max_deferred=", shape.max_deferred,
               " (the weight halves a zero-bubble schedule may defer) ",
               splits_backward(kind) ? "must be -1 or more" : "must be -1 for this schedule"));
  if (kind == PipeSchedule::dualpipe_v && m < 2 * p - 1)
    throw Error(concat(
        "pipeline schedule dualpipev needs micro_batches >= 2*stages - 1: ", "micro_batches=", m,
        ", stages=", p, " (use at least ", 2 * p - 1, ", or zb-v)"));
  ComputeOrder order;
  switch (kind) {
    case PipeSchedule::gpipe:
      order = gpipe(shape);
      break;
    case PipeSchedule::one_f_one_b:
      order = one_f_one_b(shape);
      break;
    case PipeSchedule::interleaved:
      order = interleaved(shape);
      break;
    case PipeSchedule::zb_h1:
      order = zb_h1(shape);
      break;
    case PipeSchedule::zb_v:
      order = zb_v(shape);
      break;
    case PipeSchedule::dualpipe_v:
      order = dualpipe_v(shape);
      break;
  }
  Schedule s{kind, shape, {}};
  s.ranks.resize(p);
  for (int r = 0; r < p; ++r) s.ranks[r] = with_p2p(shape, r, order[r]);
  return s;
}

double formula_bubble_fraction(PipeSchedule kind, const ScheduleShape& s) {
  const double p = s.stages, v = s.virtual_stages, m = s.micro_batches;
  switch (kind) {
    case PipeSchedule::gpipe:
    case PipeSchedule::one_f_one_b:
      return (p - 1) / m;
    case PipeSchedule::interleaved:
      return (p - 1) / (v * m);
    case PipeSchedule::zb_h1:
      return (p - 1) / (3 * m);
    case PipeSchedule::zb_v:
      return (p - 1) / (6 * m);
    case PipeSchedule::dualpipe_v:  // its pairs run as two actions: as ZB-V
      return (p - 1) / (6 * m);
  }
  return 0;
}

int formula_peak_in_flight(PipeSchedule kind, const ScheduleShape& s, int rank) {
  const int p = s.stages, v = s.virtual_stages, m = s.micro_batches;
  switch (kind) {
    case PipeSchedule::gpipe:
      return m;
    case PipeSchedule::one_f_one_b:
      return std::min(p - rank, m);
    case PipeSchedule::interleaved:
      return std::min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v);
    case PipeSchedule::zb_h1:
      return std::min(p, m);
    case PipeSchedule::zb_v:
      return std::min({2 * p, m + 1 + rank, 2 * m});
    case PipeSchedule::dualpipe_v:
      return std::min(2 * p + 1, 2 * m);
  }
  return 0;
}

std::string gradient_order_error(const Schedule& s, int rank) {
  std::map<int, size_t> last;  // stage -> index of its last B or Bw
  const std::vector<Action>& actions = s.ranks[static_cast<size_t>(rank)];
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == ActionKind::backward || actions[i].kind == ActionKind::backward_weight)
      last[stage_of(s.shape, rank, actions[i].chunk)] = i;
  for (auto it = last.begin(); std::next(it) != last.end(); ++it)
    if (it->second < std::next(it)->second)
      return concat("rank ", rank, " runs its last weight-gradient action of stage ", it->first,
                    " (#", it->second, ") before that of the later stage ", std::next(it)->first,
                    " (#", std::next(it)->second,
                    "): DDP and ZeRO would reduce the later stage's gradients unfinished");
  return "";
}

Simulation simulate(const Schedule& s, const ActionCosts& costs) {
  const int p = s.shape.stages, v = s.shape.virtual_stages, m = s.shape.micro_batches;
  const int last = p * v - 1;
  LLMT_CHECK(static_cast<int>(s.ranks.size()) == p, "schedule has ", s.ranks.size(),
             " rank lists for stages=", p);
  // A chunk holds 1/v of the rank's layers, so its actions cost 1/v of the per-rank costs.
  const double scale = 1.0 / v;

  // Messages in flight on one link, matched first in first out: (src, dst, 0 act / 1 grad) ->
  // (mb, chunk at the receiver, arrival time).
  struct Message {
    int mb, chunk;
    double arrival;
  };
  std::map<std::tuple<int, int, int>, std::deque<Message>> links;

  // Per rank and (mb, chunk): what has happened so far.
  struct UnitState {
    bool act_in = false, fwd = false, sent_act = false, grad_in = false, bwd_in = false,
         full_bwd = false, bwd_w = false, sent_grad = false;
  };
  std::vector<std::vector<UnitState>> state(p, std::vector<UnitState>(m * v));
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0), busy(p, 0);
  std::vector<int> alive(p, 0);
  std::vector<bool> in_pair(p, false);  // between the two halves of a timed F&B pair

  Simulation sim;
  sim.ranks.resize(p);
  sim.peak_in_flight.assign(p, 0);

  auto fail = [&](int r, size_t i, const std::string& why) {
    throw Error(concat("pipeline schedule ", schedule_name(s.kind), " (stages=", p,
                       ", virtual_stages=", v, ", micro_batches=", m, "): rank ", r, " action #", i,
                       " ", describe(s.ranks[r][i]), ": ", why));
  };

  // Runs rank r's actions until it blocks on a recv; returns whether it ran any.
  auto advance = [&](int r) {
    bool ran = false;
    while (pc[r] < s.ranks[r].size()) {
      const size_t i = pc[r];
      const Action& a = s.ranks[r][i];
      if (a.mb < 0 || a.mb >= m || a.chunk < 0 || a.chunk >= v)
        fail(r, i, concat("micro-batch or chunk out of range (m=", m, ", v=", v, ")"));
      const int stage = stage_of(s.shape, r, a.chunk);
      const int prev_rank = rank_of(s.shape, std::max(stage - 1, 0));
      const int next_rank = rank_of(s.shape, stage + 1);
      UnitState& u = state[r][a.mb * v + a.chunk];
      switch (a.kind) {
        case ActionKind::recv_act:
        case ActionKind::recv_grad: {
          const bool act = a.kind == ActionKind::recv_act;
          if (act ? stage == 0 : stage == last)
            fail(r, i, concat("stage ", stage, " has no ", act ? "previous" : "next", " stage"));
          const int src = act ? prev_rank : next_rank;
          if (a.peer != src) fail(r, i, concat("the peer must be rank ", src));
          if (act ? u.act_in : u.grad_in) fail(r, i, "received twice");
          std::deque<Message>& q = links[{src, r, act ? 0 : 1}];
          if (q.empty()) return ran;  // blocks
          if (q.front().mb != a.mb || q.front().chunk != a.chunk)
            fail(r, i,
                 concat("the next message on that link is for (mb ", q.front().mb, ", chunk ",
                        q.front().chunk, "): sends and recvs are posted in different orders"));
          clock[r] = std::max(clock[r], q.front().arrival);
          q.pop_front();
          (act ? u.act_in : u.grad_in) = true;
          break;
        }
        case ActionKind::send_act:
        case ActionKind::send_grad: {
          const bool act = a.kind == ActionKind::send_act;
          if (act ? stage == last : stage == 0)
            fail(r, i, concat("stage ", stage, " has no ", act ? "next" : "previous", " stage"));
          const int dst = act ? next_rank : prev_rank;
          if (a.peer != dst) fail(r, i, concat("the peer must be rank ", dst));
          if (act ? !u.fwd : !(u.bwd_in || u.full_bwd))
            fail(r, i,
                 concat("runs before the ", act ? "forward" : "backward", " that produces it"));
          if (act ? u.sent_act : u.sent_grad) fail(r, i, "sent twice");
          (act ? u.sent_act : u.sent_grad) = true;
          const int dst_chunk = chunk_of(s.shape, act ? stage + 1 : stage - 1);
          links[{r, dst, act ? 0 : 1}].push_back({a.mb, dst_chunk, clock[r] + costs.p2p});
          break;
        }
        case ActionKind::forward:
          if (u.fwd) fail(r, i, "forward runs twice");
          if (stage > 0 && !u.act_in) fail(r, i, "runs before the recv_act of its input");
          if (a.paired && costs.forward_backward > 0) {
            // One F&B block: it also waits for the paired backward's output gradient.
            size_t j = i + 1;
            while (j < s.ranks[r].size() && !is_compute(s.ranks[r][j].kind)) ++j;
            if (j == s.ranks[r].size() || s.ranks[r][j].kind != ActionKind::backward)
              fail(r, i, "is paired, but the rank's next compute action is not a full backward");
            const Action& pb = s.ranks[r][j];
            if (stage_of(s.shape, r, pb.chunk) < last) {
              std::deque<Message>& q =
                  links[{rank_of(s.shape, stage_of(s.shape, r, pb.chunk) + 1), r, 1}];
              if (q.empty()) return ran;  // blocks
              if (q.front().mb != pb.mb || q.front().chunk != pb.chunk)
                fail(r, i, "the paired backward's gradient is not the next one on its link");
              clock[r] = std::max(clock[r], q.front().arrival);
            }
            in_pair[r] = true;
          }
          u.fwd = true;
          sim.peak_in_flight[r] = std::max(sim.peak_in_flight[r], ++alive[r]);
          break;
        case ActionKind::backward:
        case ActionKind::backward_input:
          if (!u.fwd) fail(r, i, "runs before its forward");
          if (u.bwd_in || u.full_bwd) fail(r, i, "backward runs twice");
          if (stage < last && !u.grad_in) fail(r, i, "runs before the recv_grad of its output");
          (a.kind == ActionKind::backward ? u.full_bwd : u.bwd_in) = true;
          if (a.kind == ActionKind::backward) --alive[r];
          break;
        case ActionKind::backward_weight:
          if (!u.bwd_in) fail(r, i, "runs before its backward_input (Bi)");
          if (u.bwd_w) fail(r, i, "runs twice");
          u.bwd_w = true;
          --alive[r];
          break;
      }
      if (is_compute(a.kind)) {
        double d = cost_of(costs, a.kind) * scale;
        if (in_pair[r]) {  // a share of the pair's time, in the ratio of F to B
          d = costs.forward_backward * scale * cost_of(costs, a.kind) /
              (costs.forward + costs.backward);
          if (a.kind == ActionKind::backward) in_pair[r] = false;
        }
        sim.ranks[r].push_back({a, clock[r], clock[r] + d});
        clock[r] += d;
        busy[r] += d;
      }
      ++pc[r];
      ran = true;
    }
    return ran;
  };

  // Blocking recvs and buffered sends make this a Kahn network: the times do not depend on the
  // order ranks are advanced in, so sweeping until no rank moves is exact.
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) moved = advance(r) || moved;
  }
  std::string stuck;
  for (int r = 0; r < p; ++r) {
    if (pc[r] < s.ranks[r].size())
      stuck += concat("; rank ", r, " waits at action #", pc[r], " ", describe(s.ranks[r][pc[r]]));
  }
  if (!stuck.empty())
    throw Error(concat("pipeline schedule ", schedule_name(s.kind), " (stages=", p,
                       ", virtual_stages=", v, ", micro_batches=", m, ") deadlocks", stuck));
  for (const auto& [link, q] : links) {
    if (!q.empty())
      throw Error(concat("pipeline schedule ", schedule_name(s.kind), ": rank ", std::get<0>(link),
                         " sends ", std::get<2>(link) == 0 ? "send_act" : "send_grad", "(mb ",
                         q.front().mb, ") to rank ", std::get<1>(link), " that is never received (",
                         q.size(), " unmatched)"));
  }
  for (int r = 0; r < p; ++r) {
    for (int unit = 0; unit < m * v; ++unit) {
      const UnitState& u = state[r][unit];
      const bool done = u.fwd && (u.full_bwd || (u.bwd_in && u.bwd_w));
      if (!done)
        throw Error(concat("pipeline schedule ", schedule_name(s.kind), ": rank ", r,
                           " never runs ", !u.fwd ? "the forward" : "the whole backward",
                           " of (mb ", unit / v, ", chunk ", unit % v, ")"));
    }
  }
  for (int r = 0; r < p; ++r)
    if (const std::string e = gradient_order_error(s, r); !e.empty())
      throw Error(concat("pipeline schedule ", schedule_name(s.kind), ": ", e));
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  double sum = 0;
  for (int r = 0; r < p; ++r) {
    sum += busy[r] > 0 ? (sim.makespan - busy[r]) / busy[r] : 0;
    sim.idle.push_back(sim.makespan - busy[r]);
  }
  sim.bubble_fraction = sum / p;
  return sim;
}

std::string format_actions(const std::vector<Action>& actions, int virtual_stages, bool with_p2p) {
  std::string out;
  for (const Action& a : actions) {
    if (!with_p2p && !is_compute(a.kind)) continue;
    if (!out.empty()) out += ' ';
    const std::string unit = virtual_stages > 1 ? concat(a.mb, ".", a.chunk) : std::to_string(a.mb);
    if (is_compute(a.kind)) {
      out += concat(action_name(a.kind), unit);
    } else {
      // send_act -> "sa3>1" (to rank 1), recv_grad -> "rg3<1" (from rank 1).
      const bool send = a.kind == ActionKind::send_act || a.kind == ActionKind::send_grad;
      const bool act = a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act;
      out += concat(send ? "s" : "r", act ? "a" : "g", unit, send ? ">" : "<", a.peer);
    }
  }
  return out;
}

std::string schedule_svg(const Schedule& s, const Simulation& sim) {
  const int p = s.shape.stages, v = s.shape.virtual_stages;
  const double unit = 28;  // pixels per unit of simulated time
  const double row = 30, top = 40, left = 70, pad = 4;
  const double width = left + sim.makespan * unit + 20;
  const double height = top + p * row + 50;
  // Fill per action kind; later chunks drawn lighter so interleaved chunks stay apart.
  auto fill = [](ActionKind k) -> const char* {
    switch (k) {
      case ActionKind::forward:
        return "#4e79a7";
      case ActionKind::backward:
        return "#59a14f";
      case ActionKind::backward_input:
        return "#8cd17d";
      case ActionKind::backward_weight:
        return "#f28e2b";
      default:
        return "#bab0ac";
    }
  };
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"11\">\n",
                width, height);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"18\" font-size=\"13\">%s: stages %d, virtual stages %d, "
                "micro-batches %d; bubble %.3f</text>\n",
                left, schedule_name(s.kind), p, v, s.shape.micro_batches, sim.bubble_fraction);
  out += buf;
  for (int r = 0; r < p; ++r) {
    const double y = top + r * row;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"8\" y=\"%.1f\">rank %d</text>\n<rect x=\"%.0f\" y=\"%.0f\" "
                  "width=\"%.1f\" height=\"%.0f\" fill=\"#f4f4f4\"/>\n",
                  y + row / 2 + 4, r, left, y, sim.makespan * unit, row - pad);
    out += buf;
    const std::vector<TimedAction>& timed = sim.ranks[r];
    std::string borders;  // a DualPipeV F&B pair: one black border around its two boxes
    for (size_t i = 0; i < timed.size(); ++i) {
      const TimedAction& t = timed[i];
      const double x = left + t.start * unit, w = (t.end - t.start) * unit;
      if (t.action.paired && i + 1 < timed.size()) {
        std::snprintf(buf, sizeof buf,
                      "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" fill=\"none\" "
                      "stroke=\"black\" stroke-width=\"1.5\"/>\n",
                      x, y, (timed[i + 1].end - t.start) * unit, row - pad);
        borders += buf;
      }
      const double opacity = 1.0 - 0.45 * t.action.chunk / std::max(1, v - 1);
      const bool dark = t.action.kind == ActionKind::forward && opacity > 0.7;
      std::snprintf(buf, sizeof buf,
                    "<g><title>%s mb %d chunk %d: %.2f-%.2f</title><rect x=\"%.2f\" y=\"%.0f\" "
                    "width=\"%.2f\" height=\"%.0f\" fill=\"%s\" fill-opacity=\"%.2f\" "
                    "stroke=\"white\"/><text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" "
                    "fill=\"%s\">%d</text></g>\n",
                    action_name(t.action.kind), t.action.mb, t.action.chunk, t.start, t.end, x, y,
                    w, row - pad, fill(t.action.kind), opacity, x + w / 2, y + row / 2 + 2,
                    dark ? "white" : "black", t.action.mb);
      out += buf;
    }
    out += borders;
  }
  // Legend: one swatch per compute kind the schedule uses.
  std::set<ActionKind> used;
  for (const auto& rank : sim.ranks)
    for (const TimedAction& t : rank) used.insert(t.action.kind);
  double x = left;
  const double y = top + p * row + 12;
  for (ActionKind k : used) {
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
                  "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                  x, y, fill(k), x + 18, y + 11, action_name(k));
    out += buf;
    x += 60;
  }
  out += "</svg>\n";
  return out;
}

}  // namespace llmt
