// Context-parallel attention: the ring (K/V around the cp group, blocks merged by log-sum-exp)
// and Ulysses (all-to-all between sequence- and head-sharded layouts). context_parallel.h says
// what each does; docs/parallelism.md derives their communication volume.
#include "engine/parallel/context_parallel.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/ops.h"

namespace llmt {

std::string_view cp_impl_name(CpImpl i) {
  switch (i) {
    case CpImpl::ring:
      return "ring";
    case CpImpl::ulysses:
      return "ulysses";
    case CpImpl::hybrid:
      return "hybrid";
  }
  return "?";
}

int ulysses_degree(CpImpl impl, int cp, int cp_ulysses) {
  switch (impl) {
    case CpImpl::ring:
      return 1;
    case CpImpl::ulysses:
      return cp;
    case CpImpl::hybrid:
      return cp_ulysses;
  }
  return 1;
}

int64_t cp_payload(int cp, int64_t payload) {
  return cp > 1 ? payload : 0;
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

namespace {

using Piece = std::pair<Shape, DType>;

// The pieces of ContextParallelAttention's buffer, in the order its constructor carves them:
// positions; with an all-to-all (u > 1) the send/recv staging of this rank's qkv (B, Tl, W, D)
// and the head-sharded qkv, its gradient, output, output gradient (B, u Tl, H/u (+2 KV/u), D)
// and LSE (with a payload the staging holds B Tl H D values, only queries and outputs moving,
// followed by this rank's payload, the group's gathered payloads, without a ring their gradients,
// this rank's reduce-scattered gradient and one rank's block of K/V and f32 dK/dV of this rank's
// heads); with a ring (r > 1) two K/V blocks and two dK/dV accumulators (with a payload of P
// values a position: two blocks of its u ranks' payloads and their gradients' accumulators, then
// one block's K/V and its f32 dK/dV after the rest), a block's partial output and LSE, and
// (16-bit) the output merged in fp32. q/k/v and the output are in the compute type `t`, their
// gradients, partial results and the staging (which moves both) fp32.
std::vector<Piece> buffer_pieces(int u, int r, int64_t B, int64_t Tl, int64_t H, int64_t KV,
                                 int64_t D, DType t, int64_t P) {
  const int64_t Tg = u * Tl, Hg = H / u, KVg = KV / u, W = H + 2 * KV;
  std::vector<Piece> out{{Shape({Tl}), DType::i32}, {Shape({r, Tg}), DType::i32}};
  if (u > 1) {
    const int64_t moved = P > 0 ? H : W;
    for (int i = 0; i < 2; ++i) out.push_back({Shape({B * Tl * moved * D}), DType::f32});
    out.push_back({Shape({B, Tg, Hg + 2 * KVg, D}), t});
    out.push_back({Shape({B, Tg, Hg + 2 * KVg, D}), DType::f32});
    out.push_back({Shape({B, Tg, Hg, D}), t});
    out.push_back({Shape({B, Tg, Hg, D}), DType::f32});
    out.push_back({Shape({B, Hg, Tg}), DType::f32});
    if (P > 0) {
      out.push_back({Shape({B * Tl * P}), t});
      out.push_back({Shape({u * B * Tl * P}), t});
      if (r == 1) out.push_back({Shape({u * B * Tl * P}), DType::f32});
      out.push_back({Shape({B * Tl * P}), DType::f32});
      out.push_back({Shape({B, Tl, 2 * KVg, D}), t});
      out.push_back({Shape({B, Tl, 2 * KVg, D}), DType::f32});
    }
  }
  if (r > 1) {
    const Shape block = P > 0 ? Shape({B * Tg * P}) : Shape({B, Tg, 2 * KVg, D});
    for (int i = 0; i < 2; ++i) out.push_back({block, t});
    for (int i = 0; i < 2; ++i) out.push_back({block, DType::f32});
    out.push_back({Shape({B, Tg, Hg, D}), DType::f32});
    out.push_back({Shape({B, Hg, Tg}), DType::f32});
    if (t != DType::f32) out.push_back({Shape({B, Tg, Hg, D}), DType::f32});
    if (P > 0) {
      out.push_back({Shape({B, Tg, 2 * KVg, D}), t});
      out.push_back({Shape({B, Tg, 2 * KVg, D}), DType::f32});
    }
  }
  return out;
}

size_t piece_bytes(const Piece& p) {
  return (static_cast<size_t>(p.first.numel()) * dtype_size(p.second) + 63) / 64 * 64;
}

}  // namespace

size_t cp_buffer_bytes(CpImpl impl, int cp, int cp_ulysses, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t D, DType compute, int64_t payload) {
  if (cp <= 1) return 0;
  const int u = ulysses_degree(impl, cp, cp_ulysses);
  const int64_t P = cp_payload(cp, payload);
  size_t total = 0;
  for (const Piece& p : buffer_pieces(u, cp / u, B, T / cp, H, KV, D, compute, P))
    total += piece_bytes(p);
  return total;
}

CpBytes cp_bytes_per_layer(CpImpl impl, int cp, int ulysses, int64_t B, int64_t T, int64_t H,
                           int64_t KV, int64_t D, DType compute, int64_t payload) {
  CpBytes b;
  if (cp <= 1) return b;
  const int u = ulysses_degree(impl, cp, ulysses), r = cp / u;
  const double Tl = static_cast<double>(T) / cp, Bd = static_cast<double>(B);
  const double v = static_cast<double>(dtype_size(compute)) / 4.0;  // q/k/v, output: e'/e
  const int64_t P = cp_payload(cp, payload);
  if (u > 1) {
    // (With a payload only the queries move, and the payload is gathered.)
    const double Q = 4.0 * Bd * Tl * static_cast<double>((P > 0 ? H : H + 2 * KV) * D);
    const double O = 4.0 * Bd * Tl * static_cast<double>(H * D);
    b.all_to_all = (u - 1.0) / u * ((2.0 * v + 1.0) * Q + (v + 1.0) * O);
    b.forward.all_to_all = (u - 1.0) / u * v * (Q + O);
    const double E = 4.0 * Bd * Tl * static_cast<double>(P);
    b.all_gather = 2.0 * (u - 1.0) * v * E;
    b.forward.all_gather = (u - 1.0) * v * E;
    b.reduce_scatter = (u - 1.0) * E;
  }
  if (r > 1) {
    // The ring's K/V after the all-to-all: u*Tl positions of KV/u heads, as many bytes as E;
    // or the payloads of those u*Tl positions.
    const double E = 4.0 * Bd * Tl * static_cast<double>(P > 0 ? u * P : 2 * KV * D);
    b.send = b.recv = ((2.0 + (u > 1 ? 1.0 : 0.0)) * (r - 1.0) * v + r) * E;
    b.forward.send = b.forward.recv = (r - 1.0) * v * E;
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
  const int p = cp_.size(), rank = cp_.rank();
  u_ = ulysses_degree(cp_.impl, p, cp_.ulysses);
  LLMT_CHECK(u_ >= 1 && p % u_ == 0, "context parallelism: the all-to-all group of ", u_,
             " ranks does not divide cp = ", p);
  r_ = p / u_;
  ring_rank_ = rank / u_;
  uly_rank_ = rank % u_;
  LLMT_CHECK(H % u_ == 0 && KV % u_ == 0, cp_impl_name(cp_.impl), ": this rank's ", H,
             " query and ", KV, " kv heads are not divisible by the all-to-all group of ", u_,
             " ranks");
  // Groups: the all-to-all over u consecutive cp ranks, the ring over the ranks with the same
  // index in theirs (rank = ring rank * u + all-to-all rank). Pure ring or Ulysses use cp itself.
  if (u_ == p) {
    uly_ = cp_.comm;
  } else if (u_ == 1) {
    ring_ = cp_.comm;
  } else {
    own_uly_ = cp_.comm->split(rank / u_, rank % u_, "cp-a2a");
    own_ring_ = cp_.comm->split(rank % u_, rank / u_, "cp-ring");
    uly_ = own_uly_.get();
    ring_ = own_ring_.get();
  }
  Tl_ = shard_.local;
  Tg_ = u_ * Tl_;
  Hg_ = H / u_;
  KVg_ = KV / u_;
  P_ = cp_payload(p, cp_.payload);
  // One buffer, carved in 64-byte aligned pieces (buffer_pieces' order).
  std::vector<Tensor*> targets{&local_pos_, &ring_pos_};
  if (u_ > 1) {
    for (Tensor* t : {&send_, &recv_, &g_qkv_, &g_dqkv_, &g_out_, &g_dout_, &g_lse_})
      targets.push_back(t);
    if (P_ > 0) {
      targets.push_back(&own_p_);
      targets.push_back(&gath_p_);
      if (r_ == 1) targets.push_back(&dgath_p_);
      for (Tensor* t : {&down_p_, &kvs_, &dkvs_}) targets.push_back(t);
    }
  }
  if (r_ > 1) {
    for (Tensor* t : {&kv_[0], &kv_[1], &dkv_[0], &dkv_[1], &part_out_, &part_lse_})
      targets.push_back(t);
    if (compute != DType::f32) targets.push_back(&merged_);
    if (P_ > 0)
      for (Tensor* t : {&kvx_, &dkvx_}) targets.push_back(t);
  }
  const std::vector<Piece> pieces = buffer_pieces(u_, r_, B, Tl_, H, KV, D, compute, P_);
  LLMT_CHECK(pieces.size() == targets.size(), "context parallel buffer: ", pieces.size(),
             " pieces for ", targets.size(), " tensors");
  size_t total = 0;
  for (const Piece& piece : pieces) total += piece_bytes(piece);
  buf_ = alloc.allocate(total, MemCategory::comm);
  size_t off = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    *targets[i] = buf_.tensor(pieces[i].first, pieces[i].second, off);
    off += piece_bytes(pieces[i]);
  }
  // Ring rank j holds, after the all-to-all, the positions of cp ranks j*u .. j*u+u-1 in order.
  const std::vector<int32_t> mine = shard_.positions();
  std::vector<int32_t> table;
  for (int c = 0; c < p; ++c) {
    const std::vector<int32_t> pc = zigzag_shard(T, p, c).positions();
    table.insert(table.end(), pc.begin(), pc.end());
  }
  DeviceBackend& dev = alloc.backend();
  dev.copy_from_host(local_pos_.data, mine.data(), mine.size() * sizeof(int32_t));
  dev.copy_from_host(ring_pos_.data, table.data(), table.size() * sizeof(int32_t));
}

std::unique_ptr<AttentionCore> make_attention_core(ContextParallel cp, Allocator& alloc, int64_t B,
                                                   int64_t T, int64_t H, int64_t KV, int64_t D,
                                                   DType compute) {
  if (cp.size() == 1) return std::make_unique<LocalAttention>(H, KV, compute);
  return std::make_unique<ContextParallelAttention>(cp, alloc, B, T, H, KV, D, compute);
}

std::vector<Communicator*> ContextParallelAttention::own_communicators() const {
  std::vector<Communicator*> out;
  for (const auto* c : {&own_uly_, &own_ring_})
    if (*c) out.push_back(c->get());
  return out;
}

Tensor ContextParallelAttention::pos_of(int ring_rank) const {
  return ring_pos_.rows(ring_rank, ring_rank + 1).view({Tg_});
}

// Forward: (Ulysses) q/k/v to heads, attention over the ring (or alone), the output back. With
// an all-to-all group the lse stays head-sharded (backward recomputes it), so the sequence-
// sharded `lse` is left at zero.
void ContextParallelAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  if (u_ == 1) {
    attend(out, lse, qkv);
    return;
  }
  seq_to_heads(g_qkv_, qkv);
  attend(g_out_, g_lse_, g_qkv_);
  heads_to_seq(out, g_out_);
  ops::fill_zero(lse);
}

// Backward: with an all-to-all group the head-sharded output and lse are recomputed from the
// gathered q/k/v (one more attention forward, as selective recompute does; under hybrid one more
// ring pass) instead of sending the output and lse through all-to-alls; the output rounded as the
// forward's was.
void ContextParallelAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out,
                                        Tensor lse) {
  if (u_ == 1) {
    attend_backward(dqkv, dout, qkv, out, lse);
    return;
  }
  seq_to_heads(g_qkv_, qkv);
  attend(g_out_, g_lse_, g_qkv_);
  if (g_out_.dtype == DType::f32 && compute_ != DType::f32) ops::round_to(g_out_, compute_);
  seq_to_heads(g_dout_, dout);
  attend_backward(g_dqkv_, g_dout_, g_qkv_, g_out_, g_lse_);
  heads_to_seq(dqkv, g_dqkv_);
}

// ---- ring ---------------------------------------------------------------------------------------
// Step i (0..r-1) holds the K/V of ring rank src = j - i: while the block (local queries x src's
// keys) is computed, the K/V move one rank on (to j+1, from j-1). Step 0 is the local block,
// written to out/lse directly; later ones merge in. With the zigzag split, a rank src < j gives
// both local chunks src's first chunk, src > j gives the second local chunk both of src's: half
// a block each, the same on every rank. With a K/V payload (x) the payload travels where the K/V
// do. A pure ring (Tg = Tl, Hg = H): this rank's is in kv_[0] already, and each block's K/V are
// this rank's own (step 0) or expanded from the payload received (x->expand) into kvx_. Under
// hybrid a block is its group's u payloads (first_block copies this group's), every block
// expanded (expand_group) for this rank's heads.

// The K/V of step i's block: `cur` itself, or with a payload kvx_ filled from qkv or cur (under
// hybrid every block, this group's too, from its u ranks' payloads: the queries came alone).
Tensor ContextParallelAttention::block_kv(int i, Tensor cur, Tensor qkv, const KvExpansion* x) {
  if (x == nullptr) return cur;
  if (u_ > 1)
    expand_group(kvx_, 0, cur, *x);
  else if (i == 0)
    ops::copy_heads(kvx_, 0, qkv, Hg_, 2 * KVg_);
  else
    x->expand(kvx_, cur, 0, KVg_);
  return kvx_;
}

// The ring's first block, this ring rank's: its K/V heads of qkv; with a payload under a pure
// ring the payload the block wrote there (payload()), under hybrid its group's gathered payloads
// (copied: a ring pass leaves another rank's block in kv_[0]).
void ContextParallelAttention::first_block(Tensor qkv, const KvExpansion* x) {
  if (x == nullptr)
    ops::copy_heads(kv_[0], 0, qkv, Hg_, 2 * KVg_);
  else if (u_ > 1)
    ops::copy(kv_[0], gath_p_);
}

void ContextParallelAttention::attend(Tensor out_to, Tensor lse, Tensor qkv, const KvExpansion* x) {
  if (r_ == 1) {
    const Tensor all = pos_of(0);
    ops::attention_block_forward(out_to, lse, qkv, qkv, Hg_, all, all, Hg_, KVg_, scale_);
    return;
  }
  // The blocks merge in fp32; a 16-bit output is stored once, merged.
  const Tensor out = out_to.dtype == DType::f32 ? out_to : merged_;
  Communicator& comm = *ring_;
  const int p = r_, j = ring_rank_;
  const int next = (j + 1) % p, prev = (j + p - 1) % p;
  first_block(qkv, x);
  for (int i = 0; i < p; ++i) {
    const Tensor cur = kv_[i % 2];
    const int src = (j - i + p) % p;
    Handle moving;
    if (i + 1 < p) moving = comm.send_recv(cur, next, kv_[(i + 1) % 2], prev, kTagKv);
    const Tensor kv = block_kv(i, cur, qkv, x);
    if (i == 0) {
      ops::attention_block_forward(out, lse, qkv, kv, 0, pos_of(j), pos_of(src), Hg_, KVg_, scale_);
    } else {
      ops::attention_block_forward(part_out_, part_lse_, qkv, kv, 0, pos_of(j), pos_of(src), Hg_,
                                   KVg_, scale_);
      ops::attention_merge(out, lse, part_out_, part_lse_);
    }
    moving.device_wait();
  }
  if (out.data != out_to.data) ops::convert(out_to, out);
}

// Backward: K/V go around again, and with them the dK/dV accumulator of their owner: step i adds
// this rank's queries' part to src's accumulator and passes it on; after r steps each accumulator
// has visited every rank and arrives home complete (one more hop than the K/V). With a payload the
// accumulator is the payload's gradient: each block's dK/dV (dkvx_) contracts into it
// (x->contract, which adds the expansion's weight gradient too); dqkv's K/V heads stay zero and
// the payload's gradient is returned.
Tensor ContextParallelAttention::attend_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out,
                                                 Tensor lse, const KvExpansion* x) {
  ops::fill_zero(dqkv);  // the gradient accumulates block by block
  if (r_ == 1) {
    const Tensor all = pos_of(0);
    ops::attention_block_backward(dqkv, dqkv, dout, qkv, qkv, Hg_, out, lse, all, all, Hg_, KVg_,
                                  scale_);
    return {};
  }
  Communicator& comm = *ring_;
  const int p = r_, j = ring_rank_;
  const int next = (j + 1) % p, prev = (j + p - 1) % p;
  first_block(qkv, x);
  ops::fill_zero(dkv_[0]);
  for (int i = 0; i < p; ++i) {
    const Tensor cur = kv_[i % 2], dcur = dkv_[i % 2];
    const int src = (j - i + p) % p;
    Handle moving;
    if (i + 1 < p) moving = comm.send_recv(cur, next, kv_[(i + 1) % 2], prev, kTagKv);
    const Tensor kv = block_kv(i, cur, qkv, x);
    const Tensor dkv = x ? dkvx_ : dcur;
    if (x) ops::fill_zero(dkvx_);
    ops::attention_block_backward(dqkv, dkv, dout, qkv, kv, 0, out, lse, pos_of(j), pos_of(src),
                                  Hg_, KVg_, scale_);
    if (x && u_ > 1) contract_group(dcur, dkvx_, 0, cur, *x);
    if (x && u_ == 1) x->contract(dcur, dkvx_, cur, 0, KVg_);
    Handle acc = comm.send_recv(dcur, next, dkv_[(i + 1) % 2], prev, kTagDkv);
    moving.device_wait();
    acc.device_wait();
  }
  if (x) return dkv_[p % 2];
  ops::copy_heads(dqkv, Hg_, dkv_[p % 2], 0, 2 * KVg_);
  return {};
}

void ContextParallelAttention::forward(Tensor out, Tensor lse, Tensor qkv, const KvExpansion& x) {
  LLMT_CHECK(P_ > 0, "the cp attention core moves no K/V payload");
  if (u_ == 1) {
    attend(out, lse, qkv, &x);
    return;
  }
  gather_latent(qkv, x);
  attend(g_out_, g_lse_, g_qkv_, r_ > 1 ? &x : nullptr);
  heads_to_seq(out, g_out_);
  ops::fill_zero(lse);
}

// (With an all-to-all group: as backward without a payload, the head-sharded output and lse
// recomputed; the queries' gradient goes back through the all-to-all, the K/V heads' into the
// gathered payloads' gradients (the ring's accumulators under hybrid), reduce-scattered.)
Tensor ContextParallelAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out,
                                          Tensor lse, const KvExpansion& x) {
  LLMT_CHECK(P_ > 0, "the cp attention core moves no K/V payload");
  if (u_ == 1) return attend_backward(dqkv, dout, qkv, out, lse, &x);
  gather_latent(qkv, x);
  const KvExpansion* ring_x = r_ > 1 ? &x : nullptr;
  attend(g_out_, g_lse_, g_qkv_, ring_x);
  if (g_out_.dtype == DType::f32 && compute_ != DType::f32) ops::round_to(g_out_, compute_);
  seq_to_heads(g_dout_, dout);
  Tensor d_gathered = attend_backward(g_dqkv_, g_dout_, g_qkv_, g_out_, g_lse_, ring_x);
  ops::fill_zero(dqkv);
  heads_to_seq(dqkv, g_dqkv_, /*queries_only=*/true);
  if (r_ == 1) {
    ops::fill_zero(dgath_p_);
    contract_group(dgath_p_, g_dqkv_, Hg_, gath_p_, x);
    d_gathered = dgath_p_;
  }
  uly_->reduce_scatter(down_p_, d_gathered).device_wait();
  return down_p_;
}

// ---- Ulysses ------------------------------------------------------------------------------------
// The all-to-all's block for group rank k (in send_/recv_): (B,Tl,w,D), w = the heads of k's
// share. Head-sharded layout: (B,Tg,w,D) over the group's positions in rank order (group rank
// 0's Tl, then 1's, ...): this ring rank's row of the positions table.

namespace {

// The head groups of a sequence-sharded tensor: a qkv row [q (H) | k (KV) | v (KV)], or an
// attention output row (H).
struct HeadGroups {
  int64_t first[3];
  int64_t n[3];
  int count;
};
HeadGroups groups_of(int64_t W, int64_t H, int64_t KV, bool queries_only) {
  if (W == H || queries_only) return {{0, 0, 0}, {H, 0, 0}, 1};
  return {{0, H, H + KV}, {H, KV, KV}, 3};
}

// The heads of a group's share: w = the sum of its groups' n/p.
int64_t share_width(const HeadGroups& g, int p) {
  int64_t w = 0;
  for (int e = 0; e < g.count; ++e) w += g.n[e] / p;
  return w;
}

// An all-to-all staging buffer (fp32-sized) as a flat tensor of type t: 16-bit q/k/v and
// outputs move in 16 bits, gradients in fp32.
Tensor staging(const Tensor& buf, DType t) {
  return Tensor(buf.data, {static_cast<int64_t>(buf.nbytes() / dtype_size(t))}, t, buf.device);
}

}  // namespace

void ContextParallelAttention::seq_to_heads(Tensor heads, Tensor seq, bool queries_only) {
  Communicator& comm = *uly_;
  const int p = u_;
  const HeadGroups g = groups_of(seq.size(2), H_, KV_, queries_only);
  const int64_t w = share_width(g, p);
  const int64_t block = B_ * Tl_ * w * D_;
  const Tensor send = staging(send_, seq.dtype), recv = staging(recv_, seq.dtype);
  for (int k = 0; k < p; ++k) {
    Tensor dst = send.rows(k * block, (k + 1) * block).view({B_, Tl_, w, D_});
    int64_t off = 0;
    for (int e = 0; e < g.count; ++e) {
      const int64_t share = g.n[e] / p;
      ops::copy_heads(dst, off, seq, g.first[e] + k * share, share);
      off += share;
    }
  }
  Tensor in = send.rows(0, p * block), got = recv.rows(0, p * block);
  comm.all_to_all(got, in).device_wait();
  // recv block i is (B, Tl, w, D) of group rank i's positions: row b of it goes to positions
  // [i*Tl, (i+1)*Tl) of batch row b (queries_only: into its first w heads).
  const int64_t chunk = Tl_ * w * D_;
  Tensor src_rows = got.view({p * B_, chunk});
  Tensor dst_rows = heads.view({B_ * p, Tl_ * heads.size(2) * D_});
  for (int i = 0; i < p; ++i)
    for (int64_t b = 0; b < B_; ++b) {
      const Tensor dst = dst_rows.rows(b * p + i, b * p + i + 1),
                   src = src_rows.rows(i * B_ + b, i * B_ + b + 1);
      if (queries_only)
        ops::copy_heads(dst.view({1, Tl_, heads.size(2), D_}), 0, src.view({1, Tl_, w, D_}), 0, w);
      else
        ops::copy(dst, src);
    }
}

void ContextParallelAttention::heads_to_seq(Tensor seq, Tensor heads, bool queries_only) {
  Communicator& comm = *uly_;
  const int p = u_;
  const HeadGroups g = groups_of(seq.size(2), H_, KV_, queries_only);
  const int64_t w = share_width(g, p);
  const int64_t block = B_ * Tl_ * w * D_, chunk = Tl_ * w * D_;
  // In the heads' type: the output moves in the compute type even where `seq` is fp32 (selective
  // recompute's scratch), copy_heads widening it.
  const Tensor send = staging(send_, heads.dtype), recv = staging(recv_, heads.dtype);
  Tensor src_rows = heads.view({B_ * p, Tl_ * heads.size(2) * D_});
  Tensor dst_rows = send.rows(0, p * block).view({p * B_, chunk});
  for (int i = 0; i < p; ++i)
    for (int64_t b = 0; b < B_; ++b) {
      const Tensor dst = dst_rows.rows(i * B_ + b, i * B_ + b + 1),
                   src = src_rows.rows(b * p + i, b * p + i + 1);
      if (queries_only)
        ops::copy_heads(dst.view({1, Tl_, w, D_}), 0, src.view({1, Tl_, heads.size(2), D_}), 0, w);
      else
        ops::copy(dst, src);
    }
  Tensor in = send.rows(0, p * block), got = recv.rows(0, p * block);
  comm.all_to_all(got, in).device_wait();
  for (int k = 0; k < p; ++k) {
    Tensor part = got.rows(k * block, (k + 1) * block).view({B_, Tl_, w, D_});
    int64_t off = 0;
    for (int e = 0; e < g.count; ++e) {
      const int64_t share = g.n[e] / p;
      ops::copy_heads(seq, g.first[e] + k * share, part, off, share);
      off += share;
    }
  }
}

// ---- Ulysses over the payload -------------------------------------------------------------------
// Group rank k holds query heads [k Hg, (k+1) Hg) of every position of the group after the
// all-to-all; its K/V heads are the same heads (latent attention: KV = H), expanded from each
// group rank i's payload (block i of the gathered ones: sample b's positions [i Tl, (i+1) Tl)).

void ContextParallelAttention::gather_latent(Tensor qkv, const KvExpansion& x) {
  seq_to_heads(g_qkv_, qkv, /*queries_only=*/true);
  uly_->all_gather(gath_p_, own_p_).device_wait();
  if (r_ == 1) expand_group(g_qkv_, Hg_, gath_p_, x);
}

void ContextParallelAttention::expand_group(Tensor dst, int64_t h0, Tensor payloads,
                                            const KvExpansion& x) {
  const int64_t n = B_ * Tl_ * P_, head0 = uly_rank_ * KVg_;
  const Tensor rows = dst.view({B_ * u_, Tl_, dst.size(2), D_});
  for (int i = 0; i < u_; ++i) {
    x.expand(kvs_, payloads.rows(i * n, (i + 1) * n), head0, KVg_);
    for (int64_t b = 0; b < B_; ++b)
      ops::copy_heads(rows.rows(b * u_ + i, b * u_ + i + 1), h0, kvs_.rows(b, b + 1), 0, 2 * KVg_);
  }
}

void ContextParallelAttention::contract_group(Tensor d_payloads, Tensor src, int64_t h0,
                                              Tensor payloads, const KvExpansion& x) {
  const int64_t n = B_ * Tl_ * P_, head0 = uly_rank_ * KVg_;
  const Tensor rows = src.view({B_ * u_, Tl_, src.size(2), D_});
  for (int i = 0; i < u_; ++i) {
    for (int64_t b = 0; b < B_; ++b)
      ops::copy_heads(dkvs_.rows(b, b + 1), 0, rows.rows(b * u_ + i, b * u_ + i + 1), h0, 2 * KVg_);
    x.contract(d_payloads.rows(i * n, (i + 1) * n), dkvs_, payloads.rows(i * n, (i + 1) * n), head0,
               KVg_);
  }
}

}  // namespace llmt
