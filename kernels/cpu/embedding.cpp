// Token (+ learned position) embeddings. Forward gathers rows in parallel over (b,t). Backward
// scatters rows into dwte/dwpe, where two tokens may share a row: threads split the channels
// instead of the rows, so each thread owns a column slice of every row and nothing races.
// wte may be a vocabulary shard (rows [vocab_start, vocab_start + Vl) of V): tokens outside it
// read zeros and scatter nothing, so the shards' outputs sum to the whole lookup.
#include <algorithm>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

void check_tokens(const int32_t* tokens, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n)
    LLMT_CHECK(tokens[n] >= 0 && tokens[n] < V, "embedding: token id ", tokens[n], " at index ", n,
               " is outside the vocabulary [0, ", V, ")");
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset,
                       const int32_t* pos, int64_t vocab_start, int64_t Vl) {
  check_tokens(tokens, B * T, V);
  parallel_for(B * T, grain_rows(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      float* o = out + n * C;
      const int64_t row = tokens[n] - vocab_start;
      if (row < 0 || row >= Vl) {
        if (wpe)
          std::copy_n(wpe + position(pos, pos_offset, n % T) * C, C, o);
        else
          std::fill(o, o + C, 0.0f);
        continue;
      }
      const float* e = wte + row * C;
      if (wpe) {
        const float* p = wpe + position(pos, pos_offset, n % T) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else {
        std::copy(e, e + C, o);
      }
    }
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset,
                        const int32_t* pos, int64_t vocab_start, int64_t Vl) {
  check_tokens(tokens, B * T, V);
  // Column slices of 16 floats (one cache line) keep threads off each other's lines.
  constexpr int64_t kLine = 16;
  const int64_t lines = (C + kLine - 1) / kLine;
  parallel_for(lines, grain_rows(B * T * kLine), [&](int64_t begin, int64_t end) {
    const int64_t c0 = begin * kLine, c1 = std::min(C, end * kLine);
    for (int64_t n = 0; n < B * T; ++n) {
      const float* d = dout + n * C;
      const int64_t row = tokens[n] - vocab_start;
      if (row >= 0 && row < Vl) accumulate(dwte + row * C + c0, d + c0, c1 - c0);
      if (dwpe) accumulate(dwpe + position(pos, pos_offset, n % T) * C + c0, d + c0, c1 - c0);
    }
  });
}

}  // namespace llmt::cpu
