// The order in which ZeRO gathers, releases, stages and reduces its units around the model's
// hooks (zero.h), written once over a few primitives. Zero runs it on its buffers and
// collectives; `plan` runs the same order over byte counts (plan/cost_model.cpp's replay), so
// the peak of ZeRO's buffers and stage 3's all-gathers it predicts follow what Zero does.
//
// Units: 0 is the root (blocks 0 and L+1: embeddings, final norm and head), l (1..L) layer l.
//   stage 3, forward: each unit gathered before its block, the previous layer released, the
//            next layer's gather started one block early; the root gathered at each
//            micro-batch's start and before the head, which prefetches layer L for backward.
//   stage 3, backward: each layer gathered again (the one below prefetched), released after its
//            backward.
//   stages 2-3: a gradient staging buffer bound before each unit's backward (the root's kept
//            until block 0 reduces it), reduced right after it, every micro-batch; stage 1
//            reduces on the last micro-batch only. At most two units' reductions in flight.
#pragma once

#include <cstddef>

namespace llmt {

class ZeroSequence {
 public:
  ZeroSequence(int stage, int L) : stage_(stage), L_(L) {}
  virtual ~ZeroSequence() = default;

  // The hooks, as DataParallel's of the same names (ModelHooks' blocks 0..L+1).
  void on_start_micro_batch(bool last);
  void on_before_forward(int block);
  void on_before_backward(int block);
  void on_after_backward(int block);
  void on_finish_backward();

  int unit_of(int block) const { return block == 0 || block == L_ + 1 ? 0 : block; }

 protected:
  int zero_stage() const { return stage_; }
  int num_layers() const { return L_; }
  bool last_micro_batch() const { return last_micro_; }

  // The primitives; each is a no-op for a unit this rank holds no parameters of.
  virtual void start_gather(int unit) = 0;     // its all-gather starts, unless gathered or started
  virtual void finish_gather(int unit) = 0;    // it is gathered (the gather started if need be)
  virtual void release_gather(int unit) = 0;   // its gathered copy, or gather in flight, freed
  virtual bool holds(int unit) const = 0;      // this rank holds parameters of the unit
  virtual bool staged(int unit) const = 0;     // its gradient staging buffer exists
  virtual void stage_gradients(int unit) = 0;  // a gradient staging buffer bound for its backward
  virtual void start_reduce(int unit) = 0;     // its reduce-scatter starts (at most two in flight)
  // Completes the oldest reductions until those of at most `keep` units are in flight.
  virtual void complete_reductions(size_t keep) = 0;
  virtual void poll() {}  // progress of what is in flight (before each backward)

 private:
  int stage_, L_;
  bool last_micro_ = true;
};

}  // namespace llmt
