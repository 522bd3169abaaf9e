// The CPU kernels behind kernels/ops.h, on raw pointers: ops.cpp has checked shapes, dtypes and
// devices, so a kernel only computes. Semantics (assign activation grads, add into weight grads,
// optional = nullptr) are those of ops.h; attention lives in attention.h.
//
// Dims: B batch, T sequence, C channels, V vocabulary, N rows (B*T), P position-table rows,
// IC/OC in/out features, F ffn hidden, HT heads in a rope tensor, D head dim, n element count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/rope_math.h"

namespace llmt::cpu {

#include "kernels/kernel_decls.inc"

}  // namespace llmt::cpu
