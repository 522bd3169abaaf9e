// The attention core of a layer: causal attention of a rank's positions, q/k/v in, output and
// log-sum-exp out. The Attention block (engine/model/blocks.h) calls one through this interface,
// so context parallelism is a swap of the core, not a branch in the block: LocalAttention (the
// whole sequence on this rank, ops::attention_*) or ContextParallelAttention (context_parallel.h).
//
// Dims: B micro-batch, T the positions of a sequence this rank holds, H/KV this tp rank's query
// and kv heads, D head dim; qkv (B,T,H+2KV,D) after RoPE, out (B,T,H,D), lse (B,H,T).
#pragma once

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace llmt {

class Communicator;

class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // (T) i32 global positions of this rank's rows, or undefined for positions 0..T-1.
  virtual Tensor positions() const = 0;
  virtual void forward(Tensor out, Tensor lse, Tensor qkv) = 0;
  // dqkv assigned; out and lse are forward's.
  virtual void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) = 0;
  // Communicators the core split off its group (context parallelism's hybrid groups), whose
  // traffic the metrics report beside the mesh axes'.
  virtual std::vector<Communicator*> own_communicators() const { return {}; }
};

// The whole sequence on this rank. compute: the type qkv's values are representable in (ops.h
// `operands`).
class LocalAttention final : public AttentionCore {
 public:
  LocalAttention(int64_t H, int64_t KV, DType compute) : H_(H), KV_(KV), compute_(compute) {}
  Tensor positions() const override { return {}; }
  void forward(Tensor out, Tensor lse, Tensor qkv) override;
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) override;

 private:
  int64_t H_, KV_;
  DType compute_;
};

// Decoding with a KV cache (llmtrain generate): one new position of one sequence at a time (B = T
// = 1). Each layer's keys and values of positions [0, pos] stay in the cache (L, max_len, 2KV, D)
// f32: forward appends the new position's K/V (qkv after RoPE) and runs its queries against all
// of them (ops::attention_block_forward, causal by position). The layers call forward in order,
// once each per position; start(pos) begins a position. Forward only.
class KvCacheAttention final : public AttentionCore {
 public:
  KvCacheAttention(Allocator& alloc, int64_t layers, int64_t max_len, int64_t H, int64_t KV,
                   int64_t D);
  // The next forward calls are position `pos` (< max_len) of layers 0, 1, ...
  void start(int64_t pos);
  int64_t max_len() const { return max_len_; }
  Tensor positions() const override { return pos_.rows(pos_at_, pos_at_ + 1); }
  void forward(Tensor out, Tensor lse, Tensor qkv) override;
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) override;

 private:
  int64_t layers_, max_len_, H_, KV_, D_;
  Buffer cache_, pos_buf_;
  Tensor pos_;  // (max_len) i32: 0, 1, ...
  int64_t pos_at_ = 0, layer_ = 0;
};

}  // namespace llmt
