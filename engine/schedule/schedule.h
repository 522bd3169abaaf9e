// Pipeline schedules as data (docs/pipeline.md): a schedule is a pure function of (stages, virtual
// stages, micro-batches) giving each pp rank its ordered list of actions. Nothing here touches a
// model or a communicator, so tests check schedules without running anything and `llmtrain plan
// --schedule` prints and draws them; the executor (executor.h) runs any of them.
//
// Terms. p pp ranks, v model chunks per rank (virtual stages; 1 except for interleaved), m
// micro-batches per step. Model chunk c of rank r is global stage s = c * p + r (Megatron's
// interleaved assignment; with v = 1, stage s = rank r), or with the V-shaped order of ZB-V stage
// r for chunk 0 and 2p-1-r for chunk 1 (rank 0 holds the first and the last stage). Stage 0 holds
// the embeddings, stage p*v-1 the head and the loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llmt {

// Pipeline schedules: GPipe (all forwards, then all backwards), 1F1B (PipeDream-Flush),
// interleaved 1F1B over virtual stages (Megatron PTD-P), ZB-H1 (zero bubble: backward split into
// input- and weight-gradient parts), ZB-V (zero bubble over two chunks per rank in a V, split
// backward), DualPipeV (DeepSeek-V3's DualPipe cut in half: the V of ZB-V, the steady phase pairing
// one micro-batch's forward with another's full backward). [parallel] pp_schedule names one
// (parallel_config.h).
enum class PipeSchedule : uint8_t { gpipe, one_f_one_b, interleaved, zb_h1, zb_v, dualpipe_v };

// Whether the schedule splits backwards into backward_input and backward_weight (ZB-H1, ZB-V; some
// of DualPipeV's, the others run whole).
inline bool splits_backward(PipeSchedule kind) {
  return kind == PipeSchedule::zb_h1 || kind == PipeSchedule::zb_v ||
         kind == PipeSchedule::dualpipe_v;
}
// Whether its stages go down the ranks and back up (ZB-V, DualPipeV: chunk 1 of rank r is stage
// 2p-1-r).
inline bool v_shaped(PipeSchedule kind) {
  return kind == PipeSchedule::zb_v || kind == PipeSchedule::dualpipe_v;
}

enum class ActionKind : uint8_t {
  forward,          // forward of (mb, chunk); on the last stage also the loss
  backward,         // full backward of (mb, chunk): input and weight gradients
  backward_input,   // ZB: the gradient w.r.t. the chunk's input only (what the previous stage waits
                    // for)
  backward_weight,  // ZB: the weight gradients of (mb, chunk), deferred
  send_act,         // send the output activation of (mb, chunk) to the next stage's rank
  recv_act,         // receive the input activation of (mb, chunk) from the previous stage's rank
  send_grad,        // send the input gradient of (mb, chunk) to the previous stage's rank
  recv_grad,        // receive the output gradient of (mb, chunk) from the next stage's rank
};

struct Action {
  ActionKind kind;
  int mb = 0;     // micro-batch, 0..m-1
  int chunk = 0;  // model chunk on this rank, 0..v-1
  int peer = -1;  // send/recv only: the pp rank on the other side
  // DualPipeV: this forward and the rank's next compute action, a full backward of another
  // micro-batch, are one "F&B" pair, which DualPipe overlaps (one's communication behind the
  // other's compute). The executor runs the two one after the other; simulate() runs them as one
  // block when ActionCosts::forward_backward is set.
  bool paired = false;
  bool operator==(const Action&) const = default;
};

struct ScheduleShape {
  int stages = 1;          // p, pp ranks
  int virtual_stages = 1;  // v
  int micro_batches = 1;   // m
  // The V-shaped stage order (v_shaped(kind)): make_schedule sets it from the schedule's kind.
  bool v_shape = false;
  // The zero-bubble schedules: at most this many weight halves wait on a rank
  // (parallel.pp_max_deferred; ZB-H1 and ZB-V then run the oldest at once, DualPipeV splits no
  // more backwards); -1 = the schedule's own, 0 = none.
  int max_deferred = -1;
};

// ranks[r]: rank r's actions in the order it runs them. Throws Error, naming the numbers, for a
// shape the schedule cannot run (e.g. interleaved needs m % p == 0).
struct Schedule {
  PipeSchedule kind;
  ScheduleShape shape;
  std::vector<std::vector<Action>> ranks;
};

// Every generator places the p2p actions alike: recv_act right before a forward that is not on
// stage 0 and send_act right after one that is not on the last stage; recv_grad right before a B
// or Bi that is not on the last stage and send_grad right after one that is not on stage 0. On
// each link (sender, receiver, activation or gradient) the sends and the recvs list the same
// (mb, chunk) sequence, so FIFO matching per link (e.g. one MPI tag per kind) pairs them; with
// interleaving a pair of ranks exchanges both kinds in each direction, so the kinds need distinct
// tags. In a V the turn between stages p-1 and p is on rank p-1 itself: its send and recv name
// that rank as the peer (a local hand-off: the executor copies, nothing crosses the network).
Schedule make_schedule(PipeSchedule kind, const ScheduleShape& shape);

// Point-to-point channels (Communicator::send/recv, engine/comm/communicator.h): NCCL matches
// sends and receives per channel in issue order, and each channel is one stream per rank that a
// blocked call holds. The pipeline gives every (kind, sending rank's colour) a channel, the
// colour alternating along the pp ranks (0, 1, 0, 1, ...; the last rank 2 when interleaving
// closes the ring p-1 -> 0 over an odd p), so each stream of a rank carries one role: the
// activations it sends to the next rank, those it receives from the previous one, the gradients
// it sends back, or those it receives. In a V both kinds go both ways along the ranks, so the
// direction (towards lower ranks or higher) doubles the channels. With one channel, 1F1B
// deadlocks already at p = 2 (each rank's stream blocks in a send the peer's stream has queued
// behind its own send; tests/unit/schedule/test_p2p_matching.cpp).
int p2p_channels(const ScheduleShape& s);  // 4, 6 for interleaving over an odd p, 8 for a V

// The message tag of the transfer into global stage `recv_stage` of micro-batch `mb`:
// (mb * p*v + recv_stage) * p2p_channels + channel, channel = kind (activations 0, gradients 1)
// + 2 * the sender's colour (+ 4 in a V when it sends to a lower rank). Unique per message of a
// step; p2p_channel(tag, p2p_channels(s)) is its channel.
int p2p_tag(const ScheduleShape& s, int mb, int recv_stage, bool grad);

// What the executor passes to Communicator::send/recv for a p2p action of `rank` (the action's
// peer and its p2p_tag); the executor posts them in the order of the rank's action list.
struct P2pMessage {
  bool send = false;
  int peer = -1;
  int tag = 0;
  bool local = false;  // the peer is the rank itself (a V's turn): a hand-off, nothing posted
};
P2pMessage p2p_message(const ScheduleShape& s, int rank, const Action& a);
bool is_p2p(ActionKind kind);

// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"
const char* schedule_name(PipeSchedule kind);
const char* action_name(ActionKind kind);  // "F", "B", "Bi", "Bw", "send_act", ...

// Relative costs of the compute actions for simulation (the executor measures real ones). They are
// the costs of a rank's whole model part: with v chunks per rank, one chunk's action costs 1/v.
struct ActionCosts {
  double forward = 1, backward = 2, backward_input = 1, backward_weight = 1;
  double p2p = 0;  // latency of one send -> recv
  // The time of a DualPipeV pair (Action::paired), F&B in the DualPipe paper: 0 = forward +
  // backward, run as two actions (the forward does not wait for the backward's gradient: how the
  // executor runs them). > 0: the pair starts when both inputs are there and takes this long.
  double forward_backward = 0;
};

// A timed run of a schedule: every compute action with its start and end, per rank.
struct TimedAction {
  Action action;
  double start = 0, end = 0;
};
struct Simulation {
  std::vector<std::vector<TimedAction>> ranks;
  double makespan = 0;
  // idle time / busy time, averaged over ranks: (p-1)/m for GPipe and 1F1B with B = 2F.
  double bubble_fraction = 0;
  std::vector<double> idle;  // per rank: makespan - its busy time
  // Per rank: the most micro-batches whose activations are alive at once (after F, before the
  // backward that frees them: B, or Bw for ZB). With v > 1 it counts (mb, chunk) pairs, each 1/v
  // of a micro-batch's activations on the rank.
  std::vector<int> peak_in_flight;
};

// DDP and ZeRO start reducing a chunk's gradients at its step's last weight-gradient action (B or
// Bw) and expect the later stages' gradients final first: "" when on `rank` the chunks' last such
// actions run in descending order of their stages, else what runs out of order.
std::string gradient_order_error(const Schedule& s, int rank);

// Runs the schedule with blocking recv semantics and unbounded send buffers; throws Error naming
// the rank and action when it deadlocks or an action's dependency is missing, or when a rank's
// gradients would be reduced out of order (gradient_order_error).
Simulation simulate(const Schedule& s, const ActionCosts& costs = {});

// Global stage of (rank, chunk), and the reverse. In a V the odd chunks run up the ranks.
inline int stage_of(const ScheduleShape& s, int rank, int chunk) {
  if (s.v_shape && chunk % 2 == 1) return (chunk + 1) * s.stages - 1 - rank;
  return chunk * s.stages + rank;
}
inline int rank_of(const ScheduleShape& s, int stage) {
  const int i = stage % s.stages;
  return s.v_shape && (stage / s.stages) % 2 == 1 ? s.stages - 1 - i : i;
}
inline int chunk_of(const ScheduleShape& s, int stage) {
  return stage / s.stages;
}

// The published formulas (docs/references.md) that simulate() is tested against, for the
// default ActionCosts: GPipe and 1F1B (p-1)/m, interleaved (p-1)/(v*m), ZB-H1 (p-1)/(3m), ZB-V
// (p-1)/(6m) when m >= 2p-2 (the last rank's first input waits p-1 chunk forwards, half a rank's
// forward each; nothing else idles. Fewer micro-batches leave more), DualPipeV the same with its
// pairs run as two actions (DualPipe's (p-1)(F&B + B - 3W) of idle time when timed as blocks).
double formula_bubble_fraction(PipeSchedule kind, const ScheduleShape& s);
// Peak in-flight micro-batches (for interleaved and ZB-V: (micro-batch, chunk) pairs) of `rank`:
// GPipe m, 1F1B p - rank, interleaved (p-rank-1)*2 + (v-1)*p + 1, ZB-H1 p, each at most m (m*v);
// ZB-V min(2p, m + 1 + rank, 2m), DualPipeV min(2p + 1, 2m).
int formula_peak_in_flight(PipeSchedule kind, const ScheduleShape& s, int rank);

// One rank's actions as compact text: "F0 F1 B0 ..." with a ".chunk" suffix when v > 1, the p2p
// actions as "ra3<0" (recv_act of mb 3 from rank 0), "sa3>2", "rg3<2", "sg3>0" when with_p2p
// ("ra3.1<0" with chunks).
std::string format_actions(const std::vector<Action>& actions, int virtual_stages,
                           bool with_p2p = false);

// The timeline as an SVG picture: one row per rank, one box per compute action coloured by kind
// and labelled with its micro-batch, time to the right.
std::string schedule_svg(const Schedule& s, const Simulation& sim);

}  // namespace llmt
