// Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"), with the update scale of
// Moonlight (Liu et al. 2025, "Muon is scalable for LLM training"), on the hidden weight
// matrices; AdamW on every other slot (embeddings, head, norms, biases, routers).
//
// Per matrix W (m x n) with gradient g (times grad_scale), momentum buffer B, learning rate lr:
//   B <- mu * B + g;  U = nesterov ? g + mu * B : B
//   O = NS(U): X = U / (||U||_F + 1e-7); ns_steps times: A = X X^T, X <- a X + (b A + c A A) X,
//       (a, b, c) = (3.4445, -4.7750, 2.0315), on the smaller Gram: X^T X when m > n;
//   W <- W * (1 - lr * wd) - lr * 0.2 * sqrt(max(m, n)) * O     (wd only where the slot decays)
// in fp32. An expert stack [E, m, n] is E matrices, each orthogonalised alone.
//
// O needs the whole matrix, but a rank may hold only rows of it (ZeRO) or a tp shard of it. The
// strategy that owns the layout gathers it (MatrixGather): every rank of the matrix's groups
// receives the whole U, runs NS on it (the same values, so the same result) and keeps its rows.
// That costs one all-gather of U per matrix and step (the size of ZeRO-3's parameter
// all-gather) and NS on every rank of the group; giving each matrix to one owner would cut both
// (docs/parallelism.md, "Muon under the parallel layouts").
#pragma once

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "engine/optim/optimizer.h"

namespace llmt {

// The state Muon keeps for each matrix slot (its AdamW slots keep AdamW::kStateNames).
constexpr const char* kMuonState = "momentum_buffer";

// Makes a hidden matrix whole for Muon and gives back this rank's part; implemented by the
// data-parallel strategy, which knows the row groups and the tp placements.
class MatrixGather {
 public:
  virtual ~MatrixGather() = default;
  // Collective over parameter `param`'s row group and tp group: `rows` is this rank's slot rows
  // of it (undefined when it owns none), `whole` (MuonMatrix::whole) receives every rank's.
  virtual void gather(size_t param, Tensor rows, Tensor whole) = 0;
  // This rank's slot rows of `whole` into `rows` (no communication).
  virtual void take_rows(size_t param, Tensor whole, Tensor rows) = 0;
};

// A hidden matrix as Muon sees it: parameter `param`, the tensor it orthogonalises (this rank's
// tensor with its tp shards gathered: (m, n), or an expert stack (E, m, n)), and the slot of it
// this rank updates (-1: none; the rank still takes part in the gather).
struct MuonMatrix {
  size_t param = 0;
  Shape whole;
  int slot = -1;
};

// The elements of Muon's buffers for `matrices`, `own[k]` the elements of matrix k's slot (0:
// none): the momentum, two row buffers (the largest slot), the whole tensor, two Grams and B X
// (the largest matrix). Muon allocates exactly these (MemCategory::optimizer); plan counts them.
struct MuonBuffers {
  int64_t momentum = 0, rows = 0, whole = 0, gram = 0, product = 0;
  int64_t elements() const { return momentum + 2 * rows + whole + 2 * gram + product; }
};
MuonBuffers muon_buffers(const std::vector<MuonMatrix>& matrices, const std::vector<int64_t>& own);

class Muon final : public Optimizer {
 public:
  // `matrices`: in the same order on every rank of a group (spec order); every other slot gets
  // AdamW. `gather` must outlive this.
  Muon(const OptimizerConfig& cfg, Allocator& alloc, std::vector<OptimizerSlot> slots,
       std::vector<MuonMatrix> matrices, MatrixGather& gather);
  void step(double lr, int64_t t, float grad_scale) override;
  std::vector<SlotState> state() const override;

 private:
  OptimizerConfig cfg_;
  std::vector<OptimizerSlot> slots_;
  std::vector<MuonMatrix> matrices_;
  MatrixGather& gather_;
  FileStore* store_ = nullptr;       // the allocator's, when it offloads
  std::vector<size_t> adamw_slots_;  // slot index of each of adamw_'s slots
  AdamW adamw_;
  Buffer momentum_buf_;
  std::vector<Tensor> momentum_;  // by matrix (undefined where slot < 0)
  // Scratch: U's rows (and the scaled gradient), the whole matrix, the Grams and B X.
  Buffer rows_a_, rows_b_, whole_, gram_a_, gram_b_, product_;
};

// The quintic Newton-Schulz orthogonalisation of x (m, n) in place, `steps` iterations; scratch:
// a and b (at least min(m, n)^2 elements), prod (m * n). Normalises x by its Frobenius norm first.
void newton_schulz(Tensor x, int64_t steps, Tensor a, Tensor b, Tensor prod);

}  // namespace llmt
