// Context-parallel attention: the ring (K/V around the cp group, blocks merged by log-sum-exp)
// and Ulysses (all-to-all between sequence- and head-sharded layouts). context_parallel.h says
// what each does; docs/parallelism.md derives their communication volume.
#include "engine/parallel/context_parallel.h"

#include <algorithm>

#include "engine/core/check.h"
#include "kernels/ops.h"

namespace llmt {

std::string_view cp_impl_name(CpImpl i) {
  return i == CpImpl::ring ? "ring" : "ulysses";
}

std::vector<int32_t> SequenceShard::positions() const {
  std::vector<int32_t> out(static_cast<size_t>(local));
  for (const Run& r : runs)
    for (int64_t i = 0; i < r.len; ++i) out[r.local + i] = static_cast<int32_t>(r.global + i);
  return out;
}

SequenceShard zigzag_shard(int64_t T, int cp, int rank) {
  SequenceShard s;
  s.T = T;
  if (cp == 1) {
    s.local = T;
    s.runs = {{0, 0, T}};
    return s;
  }
  LLMT_CHECK(T % (2 * cp) == 0, "context parallelism: seq_len ", T,
             " is not divisible by 2*cp = ", 2 * cp);
  const int64_t c = T / (2 * cp);
  s.local = 2 * c;
  s.runs = {{0, rank * c, c}, {c, (2 * cp - 1 - rank) * c, c}};
  return s;
}

CpBytes cp_bytes_per_layer(CpImpl impl, int cp, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D) {
  CpBytes b;
  if (cp <= 1) return b;
  const double Tl = static_cast<double>(T) / cp;
  if (impl == CpImpl::ring) {
    const double E = 4.0 * static_cast<double>(B) * Tl * 2.0 * static_cast<double>(KV * D);
    b.send = b.recv = (3.0 * cp - 2.0) * E;
  } else {
    const double Q = 4.0 * static_cast<double>(B) * Tl * static_cast<double>((H + 2 * KV) * D);
    const double O = 4.0 * static_cast<double>(B) * Tl * static_cast<double>(H * D);
    b.all_to_all = (cp - 1.0) / cp * (3.0 * Q + 2.0 * O);
  }
  return b;
}

namespace {

// Message tags of the ring: K/V and the dK/dV accumulators travel at once in backward.
constexpr int kTagKv = 11, kTagDkv = 12;

}  // namespace

ContextParallelAttention::ContextParallelAttention(ContextParallel cp, Allocator& alloc, int64_t B,
                                                   int64_t T, int64_t H, int64_t KV, int64_t D,
                                                   DType compute)
    : cp_(cp),
      B_(B),
      T_(T),
      H_(H),
      KV_(KV),
      D_(D),
      compute_(compute),
      shard_(zigzag_shard(T, cp.size(), cp.rank())) {
  const int p = cp_.size();
  Tl_ = shard_.local;
  const int64_t W = H + 2 * KV;
  if (cp_.impl == CpImpl::ulysses)
    LLMT_CHECK(H % p == 0 && KV % p == 0, "ulysses: this rank's ", H, " query and ", KV,
               " kv heads are not divisible by cp = ", p);
  // One buffer, carved in 64-byte aligned pieces.
  std::vector<std::pair<Tensor*, std::pair<Shape, DType>>> pieces;
  pieces.push_back({&all_pos_, {Shape({p, Tl_}), DType::i32}});
  if (cp_.impl == CpImpl::ring) {
    for (Tensor* t : {&kv_[0], &kv_[1], &dkv_[0], &dkv_[1]})
      pieces.push_back({t, {Shape({B, Tl_, 2 * KV, D}), DType::f32}});
    pieces.push_back({&part_out_, {Shape({B, Tl_, H, D}), DType::f32}});
    pieces.push_back({&part_lse_, {Shape({B, H, Tl_}), DType::f32}});
  } else {
    const int64_t Wp = W / p, Hp = H / p;
    for (Tensor* t : {&send_, &recv_}) pieces.push_back({t, {Shape({B * Tl_ * W * D}), DType::f32}});
    for (Tensor* t : {&g_qkv_, &g_dqkv_}) pieces.push_back({t, {Shape({B, T, Wp, D}), DType::f32}});
    for (Tensor* t : {&g_out_, &g_dout_}) pieces.push_back({t, {Shape({B, T, Hp, D}), DType::f32}});
    pieces.push_back({&g_lse_, {Shape({B, Hp, T}), DType::f32}});
  }
  auto bytes_of = [](const std::pair<Shape, DType>& s) {
    return (static_cast<size_t>(s.first.numel()) * dtype_size(s.second) + 63) / 64 * 64;
  };
  size_t total = 0;
  for (const auto& piece : pieces) total += bytes_of(piece.second);
  buf_ = alloc.allocate(total, MemCategory::comm);
  size_t off = 0;
  for (const auto& [t, s] : pieces) {
    *t = buf_.tensor(s.first, s.second, off);
    off += bytes_of(s);
  }
  std::vector<int32_t> host;
  for (int r = 0; r < p; ++r) {
    const std::vector<int32_t> pr = zigzag_shard(T, p, r).positions();
    host.insert(host.end(), pr.begin(), pr.end());
  }
  alloc.backend().copy_from_host(all_pos_.data, host.data(), host.size() * sizeof(int32_t));
}

Tensor ContextParallelAttention::pos_of(int rank) const {
  return all_pos_.rows(rank, rank + 1).view({Tl_});
}

void ContextParallelAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  if (cp_.impl == CpImpl::ring)
    ring_forward(out, lse, qkv);
  else
    ulysses_forward(out, lse, qkv);
}

void ContextParallelAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out,
                                        Tensor lse) {
  if (cp_.impl == CpImpl::ring)
    ring_backward(dqkv, dout, qkv, out, lse);
  else
    ulysses_backward(dqkv, dout, qkv, out, lse);
}

// ---- ring ---------------------------------------------------------------------------------------
// Step i (0..cp-1) holds the K/V of rank src = r - i: while the block (local queries x src's keys)
// is computed, the K/V move one rank on (to r+1, from r-1). Step 0 is the local block, written to
// out/lse directly; later ones merge in. With the zigzag split, rank src < r gives both local
// chunks src's first chunk, src > r gives the second local chunk both of src's: half a block
// each, the same on every rank.

void ContextParallelAttention::ring_forward(Tensor out, Tensor lse, Tensor qkv) {
  Communicator& comm = *cp_.comm;
  const int p = comm.size(), r = comm.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  ops::copy_heads(kv_[0], 0, qkv, H_, 2 * KV_);
  for (int i = 0; i < p; ++i) {
    const Tensor cur = kv_[i % 2];
    const int src = (r - i + p) % p;
    Handle moving;
    if (i + 1 < p) moving = comm.send_recv(cur, next, kv_[(i + 1) % 2], prev, kTagKv);
    if (i == 0) {
      ops::attention_block_forward(out, lse, qkv, cur, 0, pos_of(r), pos_of(src), H_, KV_);
    } else {
      ops::attention_block_forward(part_out_, part_lse_, qkv, cur, 0, pos_of(r), pos_of(src), H_,
                                   KV_);
      ops::attention_merge(out, lse, part_out_, part_lse_);
    }
    moving.device_wait();
  }
}

// Backward: K/V go around again, and with them the dK/dV accumulator of their owner: step i adds
// this rank's queries' part to src's accumulator and passes it on; after cp steps each
// accumulator has visited every rank and arrives home complete (one more hop than the K/V).
void ContextParallelAttention::ring_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out,
                                             Tensor lse) {
  Communicator& comm = *cp_.comm;
  const int p = comm.size(), r = comm.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  ops::fill_zero(dqkv);  // the queries' gradient accumulates block by block
  ops::copy_heads(kv_[0], 0, qkv, H_, 2 * KV_);
  ops::fill_zero(dkv_[0]);
  for (int i = 0; i < p; ++i) {
    const Tensor cur = kv_[i % 2], dcur = dkv_[i % 2];
    const int src = (r - i + p) % p;
    Handle moving;
    if (i + 1 < p) moving = comm.send_recv(cur, next, kv_[(i + 1) % 2], prev, kTagKv);
    ops::attention_block_backward(dqkv, dcur, dout, qkv, cur, 0, out, lse, pos_of(r), pos_of(src),
                                  H_, KV_);
    Handle acc = comm.send_recv(dcur, next, dkv_[(i + 1) % 2], prev, kTagDkv);
    moving.device_wait();
    acc.device_wait();
  }
  ops::copy_heads(dqkv, H_, dkv_[p % 2], 0, 2 * KV_);
}

// ---- Ulysses ------------------------------------------------------------------------------------
// The all-to-all's block for rank j (in send_/recv_): (B,Tl,w,D), w = the heads of j's share.
// Head-sharded layout: (B,T,w,D) over positions in rank order (rank 0's Tl, rank 1's, ...), whose
// global positions are all_pos_ read as (T).

namespace {

// The head groups of a sequence-sharded tensor: a qkv row [q (H) | k (KV) | v (KV)], or an
// attention output row (H).
struct HeadGroups {
  int64_t first[3];
  int64_t n[3];
  int count;
};
HeadGroups groups_of(int64_t W, int64_t H, int64_t KV) {
  if (W == H) return {{0, 0, 0}, {H, 0, 0}, 1};
  return {{0, H, H + KV}, {H, KV, KV}, 3};
}

}  // namespace

void ContextParallelAttention::seq_to_heads(Tensor heads, Tensor seq) {
  Communicator& comm = *cp_.comm;
  const int p = comm.size();
  const int64_t W = seq.size(2), w = W / p;
  const HeadGroups g = groups_of(W, H_, KV_);
  const int64_t block = B_ * Tl_ * w * D_;
  for (int j = 0; j < p; ++j) {
    Tensor dst = send_.rows(j * block, (j + 1) * block).view({B_, Tl_, w, D_});
    int64_t off = 0;
    for (int k = 0; k < g.count; ++k) {
      const int64_t share = g.n[k] / p;
      ops::copy_heads(dst, off, seq, g.first[k] + j * share, share);
      off += share;
    }
  }
  Tensor in = send_.rows(0, p * block), got = recv_.rows(0, p * block);
  comm.all_to_all(got, in).device_wait();
  // recv block i is (B, Tl, w, D) of rank i's positions: row b of it goes to positions
  // [i*Tl, (i+1)*Tl) of batch row b.
  const int64_t chunk = Tl_ * w * D_;
  Tensor src_rows = got.view({p * B_, chunk}), dst_rows = heads.view({B_ * p, chunk});
  for (int i = 0; i < p; ++i)
    for (int64_t b = 0; b < B_; ++b)
      ops::copy(dst_rows.rows(b * p + i, b * p + i + 1), src_rows.rows(i * B_ + b, i * B_ + b + 1));
}

void ContextParallelAttention::heads_to_seq(Tensor seq, Tensor heads) {
  Communicator& comm = *cp_.comm;
  const int p = comm.size();
  const int64_t W = seq.size(2), w = W / p;
  const HeadGroups g = groups_of(W, H_, KV_);
  const int64_t block = B_ * Tl_ * w * D_, chunk = Tl_ * w * D_;
  Tensor src_rows = heads.view({B_ * p, chunk}), dst_rows = send_.rows(0, p * block).view({p * B_, chunk});
  for (int i = 0; i < p; ++i)
    for (int64_t b = 0; b < B_; ++b)
      ops::copy(dst_rows.rows(i * B_ + b, i * B_ + b + 1), src_rows.rows(b * p + i, b * p + i + 1));
  Tensor in = send_.rows(0, p * block), got = recv_.rows(0, p * block);
  comm.all_to_all(got, in).device_wait();
  for (int j = 0; j < p; ++j) {
    Tensor part = got.rows(j * block, (j + 1) * block).view({B_, Tl_, w, D_});
    int64_t off = 0;
    for (int k = 0; k < g.count; ++k) {
      const int64_t share = g.n[k] / p;
      ops::copy_heads(seq, g.first[k] + j * share, part, off, share);
      off += share;
    }
  }
}

// Forward: q/k/v to heads, attention over whole sequences, the output back. The lse stays
// head-sharded (backward recomputes it), so the sequence-sharded `lse` is left at zero.
void ContextParallelAttention::ulysses_forward(Tensor out, Tensor lse, Tensor qkv) {
  const int p = cp_.size();
  const int64_t Hp = H_ / p, KVp = KV_ / p;
  const Tensor all = all_pos_.view({T_});
  seq_to_heads(g_qkv_, qkv);
  ops::attention_block_forward(g_out_, g_lse_, g_qkv_, g_qkv_, Hp, all, all, Hp, KVp);
  heads_to_seq(out, g_out_);
  ops::fill_zero(lse);
}

void ContextParallelAttention::ulysses_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out,
                                                Tensor lse) {
  (void)out;
  (void)lse;
  const int p = cp_.size();
  const int64_t Hp = H_ / p, KVp = KV_ / p;
  const Tensor all = all_pos_.view({T_});
  // The head-sharded output and lse are recomputed from the gathered q/k/v (one more attention
  // forward, as selective recompute does) instead of sending out and lse through all-to-alls;
  // the output rounded as the forward's was.
  seq_to_heads(g_qkv_, qkv);
  ops::attention_block_forward(g_out_, g_lse_, g_qkv_, g_qkv_, Hp, all, all, Hp, KVp);
  if (compute_ != DType::f32) ops::round_to(g_out_, compute_);
  seq_to_heads(g_dout_, dout);
  ops::fill_zero(g_dqkv_);
  ops::attention_block_backward(g_dqkv_, g_dqkv_, g_dout_, g_qkv_, g_qkv_, Hp, g_out_, g_lse_, all,
                                all, Hp, KVp);
  heads_to_seq(dqkv, g_dqkv_);
}

}  // namespace llmt
