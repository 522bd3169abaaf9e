#include "engine/data_parallel/zero_sequence.h"

namespace llmt {

void ZeroSequence::on_start_micro_batch(bool last) {
  last_micro_ = last;
  if (stage_ == 3) start_gather(0);
}

void ZeroSequence::on_before_forward(int block) {
  if (stage_ != 3) return;
  if (block == L_ + 1) {
    // Under pp the root may have been released by another micro-batch's backward since this
    // one's embeddings ran (or, on the last stage, never gathered): a no-op on one rank.
    finish_gather(0);
    if (L_ >= 1) {
      release_gather(L_);
      start_gather(L_);  // prefetch for the backward of the last layer
    }
    return;
  }
  finish_gather(unit_of(block));
  if (block >= 2) release_gather(block - 1);
  if (block + 1 <= L_) start_gather(block + 1);
}

void ZeroSequence::on_before_backward(int block) {
  const int unit = unit_of(block);
  if (stage_ == 3 && block >= 1 && block <= L_) {
    finish_gather(unit);
    if (block - 1 >= 1) start_gather(block - 1);
  }
  // The root, as in before_forward(L+1): still gathered on one rank, maybe not under pp.
  if (stage_ == 3 && unit == 0) finish_gather(0);
  // Stages 2-3: a fresh gradient staging buffer for the unit, bound before its first backward.
  // The root's is kept until after_backward(0) reduces it: under pp, stage 0 runs no block L+1,
  // and an interleaved last stage may run several heads' backwards before its block 0.
  if (stage_ >= 2 && holds(unit) && (unit != 0 || !staged(0))) stage_gradients(unit);
  poll();
}

void ZeroSequence::on_after_backward(int block) {
  if (block == L_ + 1) return;  // the root unit completes with block 0
  const int unit = unit_of(block);
  if (stage_ >= 2 || last_micro_) start_reduce(unit);
  if (stage_ == 3) release_gather(unit);
  if (block == 0 && stage_ >= 2) complete_reductions(0);
}

void ZeroSequence::on_finish_backward() {
  complete_reductions(0);
}

}  // namespace llmt
