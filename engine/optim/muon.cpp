// Muon on the hidden matrices, AdamW on the rest (muon.h). Everything is composed of ops (GEMMs
// through linear_forward/linear_backward, elementwise scale/add), so it runs on every backend.
#include "engine/optim/muon.h"

#include <algorithm>
#include <cmath>

#include "core/file_memory.h"
#include "kernels/ops.h"

namespace llmt {

namespace {

constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;

std::vector<OptimizerSlot> adamw_part(const std::vector<OptimizerSlot>& slots,
                                      const std::vector<MuonMatrix>& matrices,
                                      std::vector<size_t>& index) {
  std::vector<bool> muon(slots.size(), false);
  for (const MuonMatrix& m : matrices)
    if (m.slot >= 0) muon[static_cast<size_t>(m.slot)] = true;
  std::vector<OptimizerSlot> out;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (muon[k]) continue;
    index.push_back(k);
    out.push_back(slots[k]);
  }
  return out;
}

// The (m, n) matrices of a whole tensor: itself, or each expert of a stack (E, m, n).
int64_t matrix_count(const Shape& s) {
  return s.ndim() == 3 ? s[0] : 1;
}
int64_t matrix_rows(const Shape& s) {
  return s[s.ndim() - 2];
}
int64_t matrix_cols(const Shape& s) {
  return s[s.ndim() - 1];
}

}  // namespace

void newton_schulz(Tensor x, int64_t steps, Tensor a, Tensor b, Tensor prod) {
  const int64_t m = x.size(0), n = x.size(1), k = std::min(m, n);
  const double norm = std::sqrt(ops::sum_squares(x));
  ops::scale_inplace(x, static_cast<float>(1.0 / (norm + 1e-7)));
  Tensor gram = a.view({k, k}), gram2 = b.view({k, k}), xb = prod.view({m, n});
  for (int64_t it = 0; it < steps; ++it) {
    if (m <= n) {
      ops::linear_forward(gram, x, x, {});         // A (m,m) = X X^T
      ops::linear_forward(gram2, gram, gram, {});  // A A^T = A A
      ops::scale_inplace(gram, kNsB);
      ops::scale_inplace(gram2, kNsC);
      ops::add(gram, gram, gram2);                    // B = b A + c A A
      ops::linear_backward(xb, {}, {}, gram, {}, x);  // B X (m,n)
    } else {
      ops::fill_zero(gram);
      ops::linear_backward({}, gram, {}, x, x, {});  // A (n,n) = X^T X
      ops::linear_forward(gram2, gram, gram, {});
      ops::scale_inplace(gram, kNsB);
      ops::scale_inplace(gram2, kNsC);
      ops::add(gram, gram, gram2);
      ops::linear_forward(xb, x, gram, {});  // X B^T = X B (m,n)
    }
    ops::scale_inplace(x, kNsA);
    ops::add_inplace(x, xb);  // X <- a X + B X
  }
}

MuonBuffers muon_buffers(const std::vector<MuonMatrix>& matrices, const std::vector<int64_t>& own) {
  MuonBuffers b;
  for (size_t k = 0; k < matrices.size(); ++k) {
    const Shape& w = matrices[k].whole;
    const int64_t m = matrix_rows(w), n = matrix_cols(w), g = std::min(m, n);
    b.momentum += own[k];
    b.rows = std::max(b.rows, own[k]);
    b.whole = std::max(b.whole, w.numel());
    b.gram = std::max(b.gram, g * g);
    b.product = std::max(b.product, m * n);
  }
  return b;
}

Muon::Muon(const OptimizerConfig& cfg, Allocator& alloc, std::vector<OptimizerSlot> slots,
           std::vector<MuonMatrix> matrices, MatrixGather& gather)
    : cfg_(cfg),
      slots_(std::move(slots)),
      matrices_(std::move(matrices)),
      gather_(gather),
      adamw_(cfg, alloc, adamw_part(slots_, matrices_, adamw_slots_)) {
  std::vector<int64_t> own;
  for (const MuonMatrix& mm : matrices_) {
    LLMT_CHECK(mm.whole.ndim() == 2 || mm.whole.ndim() == 3, "Muon: parameter ", mm.param,
               " is not a matrix or a stack of matrices: ", mm.whole.str());
    own.push_back(0);
    if (mm.slot < 0) continue;
    const OptimizerSlot& s = slots_.at(static_cast<size_t>(mm.slot));
    LLMT_CHECK(s.param == mm.param, "Muon: matrix of parameter ", mm.param, " has the slot of ",
               s.param);
    own.back() = s.value.numel();
  }
  const MuonBuffers b = muon_buffers(matrices_, own);
  auto allocate = [&](int64_t elements) {
    return alloc.allocate(static_cast<size_t>(elements) * 4, MemCategory::optimizer);
  };
  // [offload] "nvme": the momentum in files, each matrix's written back and dropped after its
  // update.
  momentum_buf_ = alloc.allocate(static_cast<size_t>(b.momentum) * 4, MemCategory::optimizer,
                                 Offload::with_optimizer);
  store_ = alloc.file_store();
  size_t off = 0;
  for (const MuonMatrix& mm : matrices_) {
    if (mm.slot < 0) {
      momentum_.emplace_back();
      continue;
    }
    const Tensor& v = slots_[static_cast<size_t>(mm.slot)].value;
    momentum_.push_back(momentum_buf_.tensor(v.shape, DType::f32, off));
    off += v.nbytes();
  }
  rows_a_ = allocate(b.rows);
  rows_b_ = allocate(b.rows);
  whole_ = allocate(b.whole);
  gram_a_ = allocate(b.gram);
  gram_b_ = allocate(b.gram);
  product_ = allocate(b.product);
}

void Muon::step(double lr, int64_t t, float grad_scale) {
  const float mu = cfg_.muon.momentum;
  for (size_t k = 0; k < matrices_.size(); ++k) {
    const MuonMatrix& mm = matrices_[k];
    Tensor update;  // U, this rank's rows
    if (mm.slot >= 0) {
      const OptimizerSlot& s = slots_[static_cast<size_t>(mm.slot)];
      Tensor g = rows_a_.tensor(s.grad.shape, DType::f32);
      ops::convert(g, s.grad);  // (16-bit gradients widened; fp32 copied)
      ops::scale_inplace(g, grad_scale);
      ops::scale_inplace(momentum_[k], mu);
      ops::add_inplace(momentum_[k], g);  // B = mu B + g
      update = rows_b_.tensor(s.grad.shape, DType::f32);
      ops::copy(update, momentum_[k]);
      if (cfg_.muon.nesterov) {
        ops::scale_inplace(update, mu);
        ops::add_inplace(update, g);  // U = g + mu B
      }
    }
    Tensor whole = whole_.tensor(mm.whole, DType::f32);
    gather_.gather(mm.param, update, whole);
    const int64_t m = matrix_rows(mm.whole), n = matrix_cols(mm.whole);
    for (int64_t e = 0; e < matrix_count(mm.whole); ++e) {
      Tensor x(whole.f32() + e * m * n, {m, n}, DType::f32, whole.device);
      newton_schulz(x, cfg_.muon.ns_steps,
                    gram_a_.tensor({std::min(m, n), std::min(m, n)}, DType::f32),
                    gram_b_.tensor({std::min(m, n), std::min(m, n)}, DType::f32),
                    product_.tensor({m, n}, DType::f32));
    }
    if (mm.slot < 0) continue;
    const OptimizerSlot& s = slots_[static_cast<size_t>(mm.slot)];
    gather_.take_rows(mm.param, whole, update);
    // W <- W (1 - lr wd) - lr 0.2 sqrt(max(m, n)) O
    const double scale = lr * 0.2 * std::sqrt(static_cast<double>(std::max(m, n)));
    ops::scale_inplace(update, static_cast<float>(-scale));
    if (s.decay) ops::scale_inplace(s.value, static_cast<float>(1.0 - lr * cfg_.weight_decay));
    ops::add_inplace(s.value, update);
    if (store_) {
      store_->drop(momentum_[k].data, momentum_[k].nbytes());
      store_->drop(s.value.data, s.value.nbytes());
    }
  }
  adamw_.step(lr, t, grad_scale);  // (Muon itself has no bias correction: t is AdamW's)
}

std::vector<SlotState> Muon::state() const {
  std::vector<SlotState> out;
  for (size_t k = 0; k < matrices_.size(); ++k)
    if (matrices_[k].slot >= 0)
      out.push_back({kMuonState, static_cast<size_t>(matrices_[k].slot), momentum_[k]});
  for (SlotState& st : adamw_.state()) {
    st.slot = adamw_slots_[st.slot];
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace llmt
