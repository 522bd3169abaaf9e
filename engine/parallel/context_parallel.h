// Context parallelism (docs/parallelism.md, "Context parallelism"): the cp ranks of a group split
// every sequence of a micro-batch. The sequence of T positions is cut into 2*cp equal chunks and
// cp rank r holds chunks r and 2cp-1-r (the zigzag split), so that under the causal mask every
// rank has the same attention work. Everything but attention is per position: the embeddings,
// RoPE and dropout only need each local row's global position (SequenceShard); the attention
// core (ContextParallelAttention) exchanges keys and values over the cp group:
//   ring     K/V of the kv heads travel around the ring (send to r+1, receive from r-1), each
//            step's block overlapped with the next block's transfer; the blocks' outputs merge
//            by their log-sum-exp. Backward sends K/V around again with the dK/dV accumulators.
//            Where the K/V expand from a narrower payload (multi-head latent attention's latent:
//            KvExpansion), the payload travels instead and each rank expands the blocks it
//            receives, and the accumulators are the payload's gradient.
//   ulysses  an all-to-all turns the sequence-sharded q/k/v into head-sharded ones (every
//            position of H/cp query and KV/cp kv heads), attention runs on whole sequences, and
//            an all-to-all turns the output back. Needs the head counts divisible by cp. With a
//            payload only the queries go through the all-to-all: the group all-gathers every
//            position's payload and each rank expands its own H/cp heads' K/V from it (a slice of
//            the expansion, no more FLOPs than expanding its own positions' K/V for every head);
//            backward reduce-scatters the payloads' gradients.
//   hybrid   both (USP, Megatron's a2a+p2p): all-to-all over groups of u consecutive cp ranks
//            (H/u heads of those u ranks' positions), then the ring over the cp/u such groups.
//            With a payload: the queries through the all-to-all, the payloads gathered in each
//            group, and the ring moves a group's u ranks' payloads, each rank expanding its
//            heads of every block.
// Parameters are replicated over cp; their gradients are summed over dp x cp with the data-
// parallel ones (engine/data_parallel), and the loss is averaged over the global tokens.
//
// Dims: B micro-batch, T seq_len, Tl = T/cp positions per rank, H/KV query/kv heads of this tp
// rank, D head dim, W = H+2KV heads of a qkv row.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "engine/comm/communicator.h"
#include "engine/parallel/attention_core.h"

namespace llmt {

enum class CpImpl : uint8_t { ring, ulysses, hybrid };
std::string_view cp_impl_name(CpImpl i);

// The global positions a cp rank holds of a sequence of T: runs of consecutive positions.
struct SequenceShard {
  struct Run {
    int64_t local, global, len;  // local indices [local, local+len) are positions [global, +len)
  };
  int64_t T = 0;      // global sequence length
  int64_t local = 0;  // positions this rank holds
  std::vector<Run> runs;

  // (local): the global position of each local index.
  std::vector<int32_t> positions() const;
  // The rows [row0, row0 + R) of a micro-batch (B, local) whose first sample is global sample
  // `first_sample`, as runs of consecutive global rows (sample * T + position): f(offset, global,
  // n) for local rows row0+offset .. +n. Adjacent runs that continue each other are joined, so
  // without cp (one run of T) the whole range is one call.
  template <typename F>
  void for_each_run(int64_t first_sample, int64_t row0, int64_t R, F&& f) const;
};

// Chunks r and 2cp-1-r of 2cp (cp = 1: the whole sequence). T must be divisible by 2cp (cp > 1).
SequenceShard zigzag_shard(int64_t T, int cp, int rank);

// Bytes one rank moves over the cp group for one layer of one micro-batch, forward and backward
// (what the communicator counts; docs/parallelism.md derives them), with E = e B Tl 2KV D (its
// K/V), Q = e B Tl (H+2KV) D (its qkv), O = e B Tl H D (its output), e = 4 bytes a value, and
// e' the compute type's (2 in bf16/fp16: q/k/v and the output move in it, their gradients in
// fp32); H/KV: this tp rank's heads; u Ulysses ranks (1 ring, cp ulysses), r = cp/u ring ranks:
//   Ulysses part: all-to-all (u-1)/u ((2e'/e + 1) Q + (e'/e + 1) O)  (qkv and output forward;
//                 qkv, dout, dqkv back)
//   ring part:    send = recv = (2(r-1) e'/e + r) E: K/V twice around, the dK/dV accumulators
//                 one hop more, and (r-1) e'/e E more under hybrid, whose backward replays the
//                 ring forward for the head-sharded output and lse
// With a K/V payload of P values a position (`payload`, cp_payload) the ring moves the payloads
// of its block's u Tl positions instead: E = e B Tl u P; the all-to-all moves the queries, not
// q/k/v (Q = e B Tl H D above), and the group all-gathers the payload twice (forward, and again
// in backward) and reduce-scatters its fp32 gradient once: all_gather = 2 (u-1) e'/e E',
// reduce_scatter = (u-1) E', E' = e B Tl P.
// `forward`: the forward's share of those, which every replay of the core's forward (selective
// recompute of the core, full recompute) moves again: the ring's (r-1) e'/e E, the all-to-all's
// (u-1)/u e'/e (Q + O), the payload's all-gather (u-1) e'/e E'.
struct CpBytes {
  struct Kinds {
    double send = 0, recv = 0, all_to_all = 0, all_gather = 0, reduce_scatter = 0;
  };
  double send = 0, recv = 0, all_to_all = 0, all_gather = 0, reduce_scatter = 0;
  Kinds forward;
};
CpBytes cp_bytes_per_layer(CpImpl impl, int cp, int ulysses, int64_t B, int64_t T, int64_t H,
                           int64_t KV, int64_t D, DType compute = DType::f32, int64_t payload = 0);
// Bytes of the one buffer (MemCategory::comm) a rank's ContextParallelAttention allocates, for
// micro-batch B, global sequence T and this tp rank's H query and KV kv heads of width D.
size_t cp_buffer_bytes(CpImpl impl, int cp, int cp_ulysses, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType compute = DType::f32, int64_t payload = 0);
// The Ulysses degree u of an implementation: 1 (ring), cp (ulysses), `cp_ulysses` (hybrid).
int ulysses_degree(CpImpl impl, int cp, int cp_ulysses);
// The payload width the cp core moves: `payload` (any implementation) when cp > 1, else 0.
int64_t cp_payload(int cp, int64_t payload);

// The cp group of one model (none: no context parallelism).
struct ContextParallel {
  Communicator* comm = nullptr;
  CpImpl impl = CpImpl::ring;
  int ulysses = 0;  // hybrid: the all-to-all group size u (1 < u < cp, dividing cp)
  // > 0: the model's K/V expand from a payload of this many values a position (KvExpansion),
  // which the cp core moves instead of the K/V, under every implementation (cp_payload).
  int64_t payload = 0;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

// Causal attention of this rank's positions against the whole sequence, for every layer of a
// model (one instance, its buffers reused layer after layer). qkv (B,Tl,W,D) after RoPE, out
// (B,Tl,H,D) and lse (B,H,Tl) as ops::attention_forward's, but over global positions.
class ContextParallelAttention final : public AttentionCore {
 public:
  // compute: the model's compute type (what Ulysses' recomputed output is rounded to, as the
  // forward's output was).
  ContextParallelAttention(ContextParallel cp, Allocator& alloc, int64_t B, int64_t T, int64_t H,
                           int64_t KV, int64_t D, DType compute = DType::f32);
  const SequenceShard& shard() const { return shard_; }
  Tensor positions() const override { return local_pos_; }  // (Tl) i32 on the model's device
  // With an all-to-all group lse is left zero: the backward recomputes the head-sharded output
  // and lse.
  void forward(Tensor out, Tensor lse, Tensor qkv) override;
  // dqkv (B,Tl,W,D) assigned; out and lse are forward's.
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) override;
  // With a K/V payload (cp.payload): this rank's payload in payload() (B*Tl*P; a pure ring's
  // first block); the ring's blocks, or the group's gathered payloads, expanded by x.
  int64_t payload_width() const override { return P_; }
  Tensor payload() const override { return P_ > 0 ? (u_ > 1 ? own_p_ : kv_[0]) : Tensor(); }
  bool reads_own_kv() const override { return P_ == 0 || u_ == 1; }
  void forward(Tensor out, Tensor lse, Tensor qkv, const KvExpansion& x) override;
  Tensor backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                  const KvExpansion& x) override;
  // Hybrid: "cp-a2a" and "cp-ring", split off the cp group.
  std::vector<Communicator*> own_communicators() const override;
  // Bytes of the buffers this holds (docs/parallelism.md derives them).
  size_t buffer_bytes() const { return buf_.bytes(); }

 private:
  // Row j of the ring's positions table: ring rank j's (Tg) positions.
  Tensor pos_of(int ring_rank) const;
  // Attention of qkv (B,Tg,Wg,D) over the ring group (alone when it has one rank): out
  // (B,Tg,Hg,D), lse (B,Hg,Tg); the backward assigns dqkv. With x the ring moves the K/V payload
  // (P_ > 0) and the backward returns its gradient.
  void attend(Tensor out, Tensor lse, Tensor qkv, const KvExpansion* x = nullptr);
  Tensor attend_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                         const KvExpansion* x = nullptr);
  Tensor block_kv(int i, Tensor cur, Tensor qkv, const KvExpansion* x);
  // kv_[0] := this ring rank's block (qkv's K/V heads, or the payloads).
  void first_block(Tensor qkv, const KvExpansion* x);
  // Ulysses: a sequence-sharded qkv (B,Tl,W,D) or output (B,Tl,H,D) -> its head-sharded share of
  // the u ranks' positions, (B,Tg,W/u,D) or (B,Tg,H/u,D), through one all-to-all; and back.
  // queries_only: of a qkv only the H query heads move, into (out of) heads [0, H/u) of `heads`.
  void seq_to_heads(Tensor heads, Tensor seq, bool queries_only = false);
  void heads_to_seq(Tensor seq, Tensor heads, bool queries_only = false);
  // An all-to-all group with a payload: g_qkv_'s query heads := this rank's share (all-to-all),
  // gath_p_ := the group's payloads (all-gather), and without a ring g_qkv_'s K/V heads := this
  // rank's heads expanded from them (expand_group).
  void gather_latent(Tensor qkv, const KvExpansion& x);
  // dst (B,Tg,.,D) heads [h0, h0+2KVg) := the K/V of this rank's KVg heads at the u Tl positions
  // whose payloads (u*B*Tl*P, group rank i's at block i: positions [i Tl, (i+1) Tl) of every
  // sample) are `payloads`, block by block through kvs_; and back: d_payloads (u*B*Tl*P f32) +=
  // their gradients from src's dK/dV heads [h0, h0+2KVg) (x.contract: kv_b's weight gradient of
  // those heads too), through dkvs_.
  void expand_group(Tensor dst, int64_t h0, Tensor payloads, const KvExpansion& x);
  void contract_group(Tensor d_payloads, Tensor src, int64_t h0, Tensor payloads,
                      const KvExpansion& x);

  ContextParallel cp_;
  std::unique_ptr<Communicator> own_ring_, own_uly_;  // hybrid: split off the cp group
  Communicator* ring_ = nullptr;                      // the ring: r = cp/u ranks (null when r = 1)
  Communicator* uly_ = nullptr;  // the all-to-all group: u ranks (null when u = 1)
  int64_t B_, T_, Tl_, H_, KV_, D_;
  int u_ = 1, r_ = 1;      // Ulysses and ring degrees, u * r = cp
  int ring_rank_ = 0;      // this rank's in the ring (cp rank / u) and in its all-to-all group
  int uly_rank_ = 0;       // (cp rank % u); groups' shapes from u and r, which a model built for
                           // counting knows without its split groups
  int64_t Tg_, Hg_, KVg_;  // what the ring attends: u*Tl positions of H/u and KV/u heads
  int64_t P_ = 0;          // the K/V payload's width a position (0: K/V travel)
  DType compute_;
  SequenceShard shard_;
  Buffer buf_;
  Tensor local_pos_;  // (Tl) i32: this rank's positions
  Tensor ring_pos_;   // (r, Tg) i32: each ring rank's positions after the all-to-all
  // ring: (B,Tg,2KVg,D) in flight (K/V in the compute type) and the dK/dV accumulators (f32);
  // with a payload, (B*Tg*P) payloads in the compute type and their gradients' accumulators (f32)
  Tensor kv_[2], dkv_[2];
  // ring with a payload: (B,Tg,2KVg,D) one block's K/V (compute type) and its dK/dV (f32)
  Tensor kvx_, dkvx_;
  // all-to-all group with a payload: (B,Tl,2KVg,D) one group rank's K/V of this rank's heads
  // (compute type) and their dK/dV (f32)
  Tensor kvs_, dkvs_;
  Tensor part_out_, part_lse_;  // ring: (B,Tg,Hg,D), (B,Hg,Tg) one block's result
  Tensor merged_;               // ring, 16-bit: (B,Tg,Hg,D) the output merged in fp32
  Tensor send_, recv_;          // ulysses: all-to-all staging (B*Tl*W*D fp32 each, any type; with a
                                // payload B*Tl*H*D: only queries and outputs move)
  // all-to-all group with a payload: this rank's (B*Tl*P) and the group's gathered (u*B*Tl*P)
  // payloads in the compute type, without a ring their gradients (f32; with one the ring's
  // accumulators hold them), and this rank's reduce-scattered one (f32)
  Tensor own_p_, gath_p_, dgath_p_, down_p_;
  // ulysses: head-sharded (B,Tg,.,D) (q/k/v and the output in the compute type), lse
  Tensor g_qkv_, g_dqkv_, g_out_, g_dout_, g_lse_;
};

// LocalAttention without context parallelism (cp.size() == 1), else ContextParallelAttention.
std::unique_ptr<AttentionCore> make_attention_core(ContextParallel cp, Allocator& alloc, int64_t B,
                                                   int64_t T, int64_t H, int64_t KV, int64_t D,
                                                   DType compute);

template <typename F>
void SequenceShard::for_each_run(int64_t first_sample, int64_t row0, int64_t R, F&& f) const {
  int64_t pend_off = 0, pend_global = 0, pend_n = 0;
  for (int64_t n = row0; n < row0 + R;) {
    const int64_t b = n / local, t = n % local;
    size_t k = 0;
    while (t >= runs[k].local + runs[k].len) ++k;
    const Run& run = runs[k];
    const int64_t len = std::min(run.local + run.len - t, row0 + R - n);
    const int64_t global = (first_sample + b) * T + run.global + (t - run.local);
    if (pend_n > 0 && pend_global + pend_n == global) {
      pend_n += len;
    } else {
      if (pend_n > 0) f(pend_off, pend_global, pend_n);
      pend_off = n - row0, pend_global = global, pend_n = len;
    }
    n += len;
  }
  if (pend_n > 0) f(pend_off, pend_global, pend_n);
}

}  // namespace llmt
