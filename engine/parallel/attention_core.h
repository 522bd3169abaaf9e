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

// Keys and values that are a function of a narrower tensor of each position (multi-head latent
// attention: the normalised kv latent and the rotated RoPE key, P = Ckv + Dr values a position,
// where the K/V are 2·KV·D): a core that moves K/V between ranks (the cp ring) moves this payload
// instead, and each rank expands what it receives. The block that owns the map implements it.
class KvExpansion {
 public:
  virtual ~KvExpansion() = default;
  // kv (B,T,2h,D) in the compute type := the K/V of kv heads [head0, head0+h) (all of them, or
  // Ulysses' share) of the B*T positions whose payload is p (B*T*P, compute type): keys then
  // values, as a qkv row holds them.
  virtual void expand(Tensor kv, Tensor p, int64_t head0, int64_t h) const = 0;
  // d_p (B*T*P) f32 += the payload's gradient through those heads, given their K/V's gradient dkv
  // (B,T,2h,D) f32 of the positions whose payload is p; the map's weight gradients += their part
  // (now: a rank holds another rank's payload only inside the core, so this runs in the
  // backward's input half, and the schedule must run the weight half with it: no zero-bubble
  // split).
  virtual void contract(Tensor d_p, Tensor dkv, Tensor p, int64_t head0, int64_t h) const = 0;
};

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
  // > 0: this core moves K/V as a KvExpansion payload of this many values a position. The caller
  // then writes its positions' payload (B*T*P, compute type) into payload() and calls the two
  // below instead of forward/backward; qkv's K/V are still this rank's own (its local block),
  // where the core reads them (reads_own_kv).
  virtual int64_t payload_width() const { return 0; }
  virtual Tensor payload() const { return {}; }
  // With a payload: whether the core reads qkv's K/V heads (a ring's local block) or expands every
  // block's K/V from the payloads (Ulysses, hybrid), so that the caller need not build them.
  virtual bool reads_own_kv() const { return true; }
  virtual void forward(Tensor out, Tensor lse, Tensor qkv, const KvExpansion& x);
  // dqkv's query heads assigned, its K/V heads zero; returns the payload's gradient (B*T*P) f32,
  // a view of the core's buffers valid until its next call. Runs x.contract (weight gradients).
  virtual Tensor backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                          const KvExpansion& x);
  // The scores' scale: 0 (the default) for 1/sqrt(D), or what the model sets once (YaRN's
  // softmax factor, kernels/rope_math.h).
  void set_scale(float scale) { scale_ = scale; }
  float scale() const { return scale_; }

 protected:
  float scale_ = 0.0f;
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
