#include "engine/parallel/attention_core.h"

#include <numeric>
#include <vector>

#include "core/check.h"
#include "kernels/ops.h"

namespace llmt {

void AttentionCore::forward(Tensor, Tensor, Tensor, const KvExpansion&) {
  LLMT_CHECK(false, "this attention core moves no K/V payload");
}

Tensor AttentionCore::backward(Tensor, Tensor, Tensor, Tensor, Tensor, const KvExpansion&) {
  LLMT_CHECK(false, "this attention core moves no K/V payload");
  return {};
}

void LocalAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  ops::attention_forward(out, lse, qkv, H_, KV_, compute_, scale_);
}

void LocalAttention::backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse) {
  ops::attention_backward(dqkv, dout, qkv, out, lse, H_, KV_, compute_, scale_);
}

KvCacheAttention::KvCacheAttention(Allocator& alloc, int64_t layers, int64_t max_len, int64_t H,
                                   int64_t KV, int64_t D)
    : layers_(layers), max_len_(max_len), H_(H), KV_(KV), D_(D) {
  LLMT_CHECK(layers >= 1 && max_len >= 1, "a KV cache of ", layers, " layers x ", max_len,
             " positions");
  cache_ = alloc.allocate(static_cast<size_t>(layers * max_len * 2 * KV * D) * 4,
                          MemCategory::activations);
  pos_buf_ = alloc.allocate(static_cast<size_t>(max_len) * 4, MemCategory::activations);
  pos_ = pos_buf_.tensor({max_len}, DType::i32);
  std::vector<int32_t> host(static_cast<size_t>(max_len));
  std::iota(host.begin(), host.end(), 0);
  alloc.backend().copy_from_host(pos_.data, host.data(), host.size() * 4);
}

void KvCacheAttention::start(int64_t pos) {
  LLMT_CHECK(pos >= 0 && pos < max_len_, "position ", pos, " is past the KV cache's ", max_len_);
  pos_at_ = pos;
  layer_ = 0;
}

void KvCacheAttention::forward(Tensor out, Tensor lse, Tensor qkv) {
  LLMT_CHECK(layer_ < layers_, "the KV cache holds ", layers_,
             " layers; start() the next position");
  LLMT_CHECK(qkv.numel() == (H_ + 2 * KV_) * D_, "decoding one position: qkv ", qkv.shape.str());
  const int64_t per_layer = max_len_ * 2 * KV_ * D_;
  Tensor cache(cache_.tensor({max_len_, 2 * KV_, D_}, DType::f32,
                             static_cast<size_t>(layer_++ * per_layer) * 4));
  const int64_t n = pos_at_ + 1;
  ops::copy_heads(cache.rows(pos_at_, n).view({1, 1, 2 * KV_, D_}), 0,
                  qkv.view({1, 1, H_ + 2 * KV_, D_}), H_, 2 * KV_);
  ops::attention_block_forward(out, lse, qkv.view({1, 1, H_ + 2 * KV_, D_}),
                               cache.rows(0, n).view({1, n, 2 * KV_, D_}), 0, positions(),
                               pos_.rows(0, n), H_, KV_, scale_);
}

void KvCacheAttention::backward(Tensor, Tensor, Tensor, Tensor, Tensor) {
  LLMT_CHECK(false, "the KV cache core decodes; it has no backward");
}

}  // namespace llmt
