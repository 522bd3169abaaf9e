// The pipeline executor (executor.h): a loop over this rank's actions. Receives are posted when
// the schedule names them and waited by the compute action that reads them; sends are waited
// before their buffer is freed (activations after the backward, gradients at the end of the step).
// A transfer whose peer is this rank (the turn of a V, stage p-1 -> p on rank p-1) is a local
// hand-off: the receive copies the sending chunk's output, or takes its input gradient's buffer.
#include "engine/pipeline/executor.h"

#include <chrono>
#include <iterator>

#include "kernels/ops.h"

namespace llmt {

PipelineExecutor::PipelineExecutor(Schedule schedule, Transformer& model, Communicator& pp,
                                   Allocator& alloc)
    : schedule_(std::move(schedule)), model_(model), pp_(pp), alloc_(alloc), rank_(pp.rank()) {
  const ScheduleShape& s = schedule_.shape;
  LLMT_CHECK(s.stages == pp.size(), "the schedule is for ", s.stages,
             " pp ranks, the pp group has ", pp.size());
  LLMT_CHECK(model.num_chunks() == s.virtual_stages, "the schedule runs ", s.virtual_stages,
             " chunks per rank, the model stage holds ", model.num_chunks());
  if (pp.size() > 1) pp.open_p2p_channels(p2p_channels(s));  // NCCL: one stream per link role
  last_backward_mb_.assign(static_cast<size_t>(s.virtual_stages), -1);
  for (const Action& a : schedule_.ranks[static_cast<size_t>(rank_)])
    if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight)
      last_backward_mb_[static_cast<size_t>(a.chunk)] = a.mb;
  // (start_backward(last) below relies on it.)
  const std::string order = gradient_order_error(schedule_, rank_);
  LLMT_CHECK(order.empty(), "pipeline schedule ", schedule_name(schedule_.kind), ": ", order);
}

double PipelineExecutor::run(const std::vector<PipelineMicroBatch>& mbs, float dloss,
                             const std::function<void(bool last)>& start_backward) {
  using clock = std::chrono::steady_clock;
  const ScheduleShape& shape = schedule_.shape;
  LLMT_CHECK(static_cast<int>(mbs.size()) == shape.micro_batches, "the schedule runs ",
             shape.micro_batches, " micro-batches, got ", mbs.size());
  const Shape act = model_.activation_shape();  // (R,C)
  const auto t_run = clock::now();
  busy_s_ = 0;
  double loss_sum = 0;
  // Receives are read only by the kernels of the compute action that takes them, so only the
  // compute stream waits (Handle::device_wait); a send's buffer is freed by the host next, so the
  // host waits.
  auto wait_take = [](std::map<Key, Handle>& m, const Key& k, bool on_device) {
    auto it = m.find(k);
    if (it == m.end()) return;
    if (on_device)
      it->second.device_wait();
    else
      it->second.wait();
    m.erase(it);
  };
  for (const Action& a : schedule_.ranks[static_cast<size_t>(rank_)]) {
    const Key key{a.mb, a.chunk};
    // Posted in action order: the order p2p_message's tests check against NCCL's matching.
    const P2pMessage msg = is_p2p(a.kind) ? p2p_message(shape, rank_, a) : P2pMessage{};
    const PipelineMicroBatch& mb = mbs[static_cast<size_t>(a.mb)];
    const bool local = msg.local;
    switch (a.kind) {
      case ActionKind::recv_act:
        if (local) {
          const int from = chunk_of(shape, stage_of(shape, rank_, a.chunk) - 1);
          ops::copy(model_.chunk_input(a.chunk, a.mb), model_.chunk_output(from, a.mb));
          break;
        }
        recv_act_[key] = pp_.recv(model_.chunk_input(a.chunk, a.mb), msg.peer, msg.tag);
        break;
      case ActionKind::forward: {
        wait_take(recv_act_, key, true);
        const auto t0 = clock::now();
        const float loss =
            model_.forward_chunk(a.chunk, a.mb, mb.tokens, mb.targets, dloss, mb.ctx);
        busy_s_ += std::chrono::duration<double>(clock::now() - t0).count();
        if (model_.chunk_has_head(a.chunk)) loss_sum += loss;
        break;
      }
      case ActionKind::send_act:
        // (A local one is copied by its recv: the output lives until this chunk's backward.)
        if (!local)
          send_act_[key] = pp_.send(model_.chunk_output(a.chunk, a.mb), msg.peer, msg.tag);
        break;
      case ActionKind::recv_grad: {
        if (local) {
          const int from = chunk_of(shape, stage_of(shape, rank_, a.chunk) + 1);
          auto it = grad_out_.find(Key{a.mb, from});
          LLMT_CHECK(it != grad_out_.end(), "recv_grad of micro-batch ", a.mb, " chunk ", a.chunk,
                     " on pp rank ", rank_, " before chunk ", from, "'s backward");
          grad_in_[key] = std::move(it->second.buf);
          grad_out_.erase(it);
          break;
        }
        Buffer& buf = grad_in_[key];
        buf = alloc_.allocate_tensor(act, DType::f32, MemCategory::comm);
        recv_grad_[key] = pp_.recv(buf.tensor(act, DType::f32), msg.peer, msg.tag);
        break;
      }
      case ActionKind::backward:
      case ActionKind::backward_input: {
        wait_take(recv_grad_, key, true);
        Tensor dout;
        if (auto it = grad_in_.find(key); it != grad_in_.end())
          dout = it->second.tensor(act, DType::f32);
        const bool full = a.kind == ActionKind::backward;
        // The hooks (gradient reductions) come with the weight gradients.
        if (full) start_backward(last_backward_mb_[static_cast<size_t>(a.chunk)] == a.mb);
        const auto t0 = clock::now();
        Tensor dx = full ? model_.backward_chunk(a.chunk, a.mb, dout, mb.tokens, mb.ctx)
                         : model_.backward_input_chunk(a.chunk, a.mb, dout, mb.ctx);
        if (dx.defined()) {  // kept for send_grad: the model's scratch is reused by the next one
          Outgoing& o = grad_out_[key];
          o.buf = alloc_.allocate(dx.nbytes(), MemCategory::comm);
          ops::copy(o.buf.tensor(dx.shape, dx.dtype), dx);
        }
        busy_s_ += std::chrono::duration<double>(clock::now() - t0).count();
        grad_in_.erase(key);
        if (full) {
          wait_take(send_act_, key, false);
          model_.free_chunk(a.chunk, a.mb);
        }
        break;
      }
      case ActionKind::backward_weight: {
        start_backward(last_backward_mb_[static_cast<size_t>(a.chunk)] == a.mb);
        const auto t0 = clock::now();
        model_.backward_weight_chunk(a.chunk, a.mb, mb.tokens, mb.ctx);
        busy_s_ += std::chrono::duration<double>(clock::now() - t0).count();
        wait_take(send_act_, key, false);
        model_.free_chunk(a.chunk, a.mb);
        break;
      }
      case ActionKind::send_grad: {
        auto it = grad_out_.find(key);
        LLMT_CHECK(it != grad_out_.end(), "send_grad of micro-batch ", a.mb, " chunk ", a.chunk,
                   " on pp rank ", rank_, " before its backward");
        if (local) break;  // taken by the recv_grad of the chunk before
        it->second.handle = pp_.send(it->second.buf.tensor(act, DType::f32), msg.peer, msg.tag);
        it->second.sent = true;
        break;
      }
    }
    // Give the transfers in flight a turn (MPI progresses only inside MPI calls).
    for (auto& [k, h] : send_act_) h.poll();
    // A sent gradient's buffer goes as soon as its send completes (kept to the end of the step,
    // a rank whose chunks all send gradients would hold m of them).
    for (auto it = grad_out_.begin(); it != grad_out_.end();)
      it = it->second.sent && it->second.handle.poll() ? grad_out_.erase(it) : std::next(it);
  }
  for (auto& [k, h] : send_act_) h.wait();
  for (auto& [k, o] : grad_out_) o.handle.wait();
  LLMT_CHECK(recv_act_.empty() && recv_grad_.empty(), "pp rank ", rank_, ": ",
             recv_act_.size() + recv_grad_.size(), " receives were never used by the schedule");
  send_act_.clear();
  grad_out_.clear();
  grad_in_.clear();

  // The loss lives on the last stage: every pp rank reports it.
  const float mean =
      from_head_rank(static_cast<float>(loss_sum / static_cast<double>(shape.micro_batches)));
  total_s_ = std::chrono::duration<double>(clock::now() - t_run).count();
  return mean;
}

double PipelineExecutor::forward_loss(const PipelineMicroBatch& mb) {
  const ScheduleShape& shape = schedule_.shape;
  const int stages = shape.stages * shape.virtual_stages;
  float loss = 0;
  for (int s = 0; s < stages; ++s) {
    if (rank_of(shape, s) != rank_) continue;
    const int chunk = chunk_of(shape, s);
    if (s > 0) {
      const int from = rank_of(shape, s - 1);
      if (from == rank_)
        ops::copy(model_.chunk_input(chunk, 0), model_.chunk_output(chunk_of(shape, s - 1), 0));
      else
        pp_.recv(model_.chunk_input(chunk, 0), from, p2p_tag(shape, 0, s, false)).device_wait();
    }
    const float l = model_.forward_chunk(chunk, 0, mb.tokens, mb.targets, 0.0f, mb.ctx);
    if (model_.chunk_has_head(chunk)) loss = l;
    if (s + 1 < stages && rank_of(shape, s + 1) != rank_)
      pp_.send(model_.chunk_output(chunk, 0), rank_of(shape, s + 1),
               p2p_tag(shape, 0, s + 1, false))
          .wait();
    // (The chunk before a local hand-off is freed after the next one has copied its output.)
    if (s > 0 && rank_of(shape, s - 1) == rank_) model_.free_chunk(chunk_of(shape, s - 1), 0);
    if (s + 1 == stages || rank_of(shape, s + 1) != rank_) model_.free_chunk(chunk, 0);
  }
  return from_head_rank(loss);
}

float PipelineExecutor::from_head_rank(float loss) {
  const ScheduleShape& shape = schedule_.shape;
  if (shape.stages > 1)
    pp_.broadcast(Tensor(&loss, {1}, DType::f32),
                  rank_of(shape, shape.stages * shape.virtual_stages - 1))
        .wait();
  return loss;
}

}  // namespace llmt
