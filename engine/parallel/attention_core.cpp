#include "engine/parallel/attention_core.h"

#include "kernels/ops.h"

namespace llmt {

void LocalAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  ops::attention_forward(out, lse, qkv, H_, KV_, compute_);
}

void LocalAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) {
  ops::attention_backward(dqkv, dout, qkv, out, lse, H_, KV_, compute_);
}

}  // namespace llmt
