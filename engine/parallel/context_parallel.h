// Context parallelism (docs/parallelism.md, "Context parallelism"): the cp ranks of a group split
// every sequence of a micro-batch. The sequence of T positions is cut into 2*cp equal chunks and
// cp rank r holds chunks r and 2cp-1-r (the zigzag split), so that under the causal mask every
// rank has the same attention work. Everything but attention is per position: the embeddings,
// RoPE and dropout only need each local row's global position (SequenceShard); the attention
// core (ContextParallelAttention) exchanges keys and values over the cp group:
//   ring     K/V of the kv heads travel around the ring (send to r+1, receive from r-1), each
//            step's block overlapped with the next block's transfer; the blocks' outputs merge
//            by their log-sum-exp. Backward sends K/V around again with the dK/dV accumulators.
//   ulysses  an all-to-all turns the sequence-sharded q/k/v into head-sharded ones (every
//            position of H/cp query and KV/cp kv heads), attention runs on whole sequences, and
//            an all-to-all turns the output back. Needs the head counts divisible by cp.
// Parameters are replicated over cp; their gradients are summed over dp x cp with the data-
// parallel ones (engine/data_parallel), and the loss is averaged over the global tokens.
//
// Dims: B micro-batch, T seq_len, Tl = T/cp positions per rank, H/KV query/kv heads of this tp
// rank, D head dim, W = H+2KV heads of a qkv row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/allocator.h"
#include "engine/core/tensor.h"

namespace llmt {

enum class CpImpl : uint8_t { ring, ulysses };
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
// (what the communicator counts; docs/parallelism.md derives them): the ring sends and receives
// (3cp-2) times its K/V, E = 4 B Tl 2KV D; Ulysses all-to-alls (cp-1)/cp (3Q + 2O) with
// Q = 4 B Tl (H+2KV) D and O = 4 B Tl H D. H/KV: this tp rank's heads.
struct CpBytes {
  double send = 0, recv = 0, all_to_all = 0;
};
CpBytes cp_bytes_per_layer(CpImpl impl, int cp, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D);

// The cp group of one model (none: no context parallelism).
struct ContextParallel {
  Communicator* comm = nullptr;
  CpImpl impl = CpImpl::ring;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

// Causal attention of this rank's positions against the whole sequence, for every layer of a
// model (one instance, its buffers reused layer after layer). qkv (B,Tl,W,D) after RoPE, out
// (B,Tl,H,D) and lse (B,H,Tl) as ops::attention_forward's, but over global positions.
class ContextParallelAttention {
 public:
  // compute: the model's compute type (what Ulysses' recomputed output is rounded to, as the
  // forward's output was).
  ContextParallelAttention(ContextParallel cp, Allocator& alloc, int64_t B, int64_t T, int64_t H,
                           int64_t KV, int64_t D, DType compute = DType::f32);
  const SequenceShard& shard() const { return shard_; }
  Tensor positions() const { return pos_of(cp_.rank()); }  // (Tl) i32 on the model's device
  // Ulysses leaves lse zero: its backward recomputes the head-sharded output and lse.
  void forward(Tensor out, Tensor lse, Tensor qkv);
  // dqkv (B,Tl,W,D) assigned; out and lse are forward's.
  void backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);
  // Bytes of the buffers this holds (docs/parallelism.md derives them).
  size_t buffer_bytes() const { return buf_.bytes(); }

 private:
  Tensor pos_of(int rank) const;  // (Tl) rank's positions
  void ring_forward(Tensor out, Tensor lse, Tensor qkv);
  void ring_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);
  void ulysses_forward(Tensor out, Tensor lse, Tensor qkv);
  void ulysses_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse);
  // Ulysses: a sequence-sharded qkv (B,Tl,W,D) or output (B,Tl,H,D) -> its head-sharded share
  // (B,T,W/cp,D) or (B,T,H/cp,D) over every position, through one all-to-all; and back.
  void seq_to_heads(Tensor heads, Tensor seq);
  void heads_to_seq(Tensor seq, Tensor heads);

  ContextParallel cp_;
  int64_t B_, T_, Tl_, H_, KV_, D_;
  DType compute_;
  SequenceShard shard_;
  Buffer buf_;
  Tensor all_pos_;             // (cp, Tl) i32: every rank's positions; ulysses: (T) gathered order
  Tensor kv_[2], dkv_[2];      // ring: (B,Tl,2KV,D) in flight
  Tensor part_out_, part_lse_;  // ring: (B,Tl,H,D), (B,H,Tl) one block's result
  Tensor send_, recv_;          // ulysses: all-to-all staging (cp * B*Tl*W/cp*D)
  Tensor g_qkv_, g_out_, g_lse_, g_dqkv_, g_dout_;  // ulysses: head-sharded whole sequences
};

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
