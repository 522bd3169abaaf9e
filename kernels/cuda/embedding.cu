// Token (+ learned position) embeddings. Forward gathers one element per thread; backward adds
// each dout row into its wte/wpe row with atomics (rows shared by repeated tokens), so dwte's
// summation order, unlike the CPU kernel's, varies from run to run in the last bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace llmt::cuda {
namespace {

void check_tokens(const int32_t* tokens, int64_t N, int64_t V) {
  const int64_t bad =
      first_bad_index(N, [=] __device__(int64_t n) { return tokens[n] < 0 || tokens[n] >= V; });
  LLMT_CHECK(bad < 0, "embedding: token id ", bad < 0 ? 0 : read_back(tokens + bad), " at index ",
             bad, " is outside the vocabulary [0, ", V, ")");
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset,
                       const int32_t* pos, int64_t vocab_start, int64_t Vl) {
  check_tokens(tokens, B * T, V);
  for_each(B * T * C, [=] __device__(int64_t i) {
    const int64_t n = i / C, c = i % C, row = tokens[n] - vocab_start;
    float v = row >= 0 && row < Vl ? wte[row * C + c] : 0.0f;
    if (wpe) v += wpe[(pos ? pos[n % T] : pos_offset + n % T) * C + c];
    out[i] = v;
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset,
                        const int32_t* pos, int64_t vocab_start, int64_t Vl) {
  check_tokens(tokens, B * T, V);
  for_each(B * T * C, [=] __device__(int64_t i) {
    const int64_t n = i / C, c = i % C, row = tokens[n] - vocab_start;
    if (row >= 0 && row < Vl) atomicAdd(dwte + row * C + c, dout[i]);
  });
  if (dwpe) {  // each position's rows: a column sum over the batch, deterministic
    for_each(T * C, [=] __device__(int64_t i) {
      const int64_t t = i / C, c = i % C;
      float s = 0.0f;
      for (int64_t b = 0; b < B; ++b) s += dout[(b * T + t) * C + c];
      dwpe[(pos ? pos[t] : pos_offset + t) * C + c] += s;
    });
  }
}

}  // namespace llmt::cuda
