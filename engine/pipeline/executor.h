// The pipeline executor: runs one pp rank's action list (schedule.h) on a pipeline-stage
// Transformer (ModelSpec::shard_pp), whatever the schedule. Sends and receives are non-blocking
// over the pp group and waited only where an action needs their data; a micro-batch's activations
// of a chunk are freed as soon as its backward is done, so the allocator's peak activation bytes
// follow the schedule's in-flight count (Simulation::peak_in_flight).
#pragma once

#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "engine/comm/communicator.h"
#include "engine/model/transformer.h"
#include "engine/schedule/schedule.h"

namespace llmt {

// One micro-batch of the step: tokens and targets (B,T) i32 on the model's device (read on the
// stages holding the embeddings and the head respectively), and its dropout keys.
struct PipelineMicroBatch {
  Tensor tokens, targets;
  StepContext ctx;
};

class PipelineExecutor {
 public:
  // `schedule`: every rank's actions; this rank is pp.rank(). The model holds this rank's chunks
  // (model.num_chunks() == schedule.shape.virtual_stages). Zero-bubble schedules' backward_input
  // and backward_weight run Transformer::backward_input_chunk / backward_weight_chunk; the
  // activations of a micro-batch are then freed after backward_weight.
  PipelineExecutor(Schedule schedule, Transformer& model, Communicator& pp, Allocator& alloc);

  // Runs this rank's actions for one step over `mbs` (schedule.shape.micro_batches of them).
  // dloss: the loss gradient scale of each micro-batch (loss_scale / (micro-batches * dp)).
  // start_backward(last) is called before every backward (backward_weight under ZB), `last` when
  // it is the step's final one of that chunk on this rank (DataParallel::start_micro_batch:
  // DDP/ZeRO start their gradient reductions during it). Returns the mean loss over the
  // micro-batches, computed on the last stage and broadcast to every pp rank.
  double run(const std::vector<PipelineMicroBatch>& mbs, float dloss,
             const std::function<void(bool last)>& start_backward);

  // Forward only (validation): the loss of one micro-batch on every pp rank, the stages run one
  // after another in global order with blocking transfers (no schedule, no gradients).
  double forward_loss(const PipelineMicroBatch& mb);

  // Of the last run: seconds in compute actions, and the run's wall time (the measured bubble is
  // (total - busy) / busy, as Simulation::bubble_fraction).
  const Schedule& schedule() const { return schedule_; }

  // The executor's own buffers at their peak (MemCategory::comm), each one boundary tensor of
  // `boundary_bytes` ((R, C) f32): a received output gradient waiting for its backward
  // (grad_in_), and on a rank whose chunks send input gradients back (past stage 0) up to two
  // being sent (grad_out_: one posted, the next computed). `plan` counts this.
  static double peak_comm_bytes(double boundary_bytes, bool sends_gradients) {
    return boundary_bytes * (sends_gradients ? 3 : 1);
  }
  double busy_seconds() const { return busy_s_; }
  double total_seconds() const { return total_s_; }

 private:
  using Key = std::tuple<int, int>;  // (mb, chunk)
  // The loss as the rank holding the last stage has it (rank p-1, rank 0 in a V), on every pp
  // rank (a broadcast over pp).
  float from_head_rank(float loss);

  Schedule schedule_;
  Transformer& model_;
  Communicator& pp_;
  Allocator& alloc_;
  int rank_;
  std::vector<int> last_backward_mb_;  // per chunk: the micro-batch of its final backward
  // In flight during a run.
  std::map<Key, Handle> recv_act_, send_act_, recv_grad_;
  std::map<Key, Buffer> grad_in_;  // received output gradients (R,C)
  struct Outgoing {
    Buffer buf;  // input gradient (R,C) being sent
    Handle handle;
    bool sent = false;  // its send_grad has posted the send: freed once that completes
  };
  std::map<Key, Outgoing> grad_out_;
  double busy_s_ = 0, total_s_ = 0;
};

}  // namespace llmt
