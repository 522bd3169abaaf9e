// Elementwise maps, fills, copies and dropout: memory-bound, so each is one vectorised pass split
// into contiguous per-thread chunks. Dropout's mask is a pure function of (seed, stream, global
// index), so forward and backward are the same map and nothing is stored between them.
#include <cstring>

#include "core/rng.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernel_util.h"

namespace llmt::cpu {
namespace {

// dst[i] = f(i) for i in [0, n), in parallel chunks.
template <typename F>
void map_indices(float* dst, int64_t n, F&& f) {
  parallel_for(n, kGrainElems, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) dst[i] = f(i);
  });
}

// The same over raw bytes (copies and zero fills of any dtype).
template <typename F>
void for_byte_chunks(size_t bytes, F&& f) {
  if (bytes == 0) return;  // an empty tensor may have no memory at all
  parallel_for(static_cast<int64_t>(bytes), 4 * kGrainElems,
               [&](int64_t begin, int64_t end) { f(begin, static_cast<size_t>(end - begin)); });
}

}  // namespace

void add(float* out, const float* a, const float* b, int64_t n) {
  map_indices(out, n, [=](int64_t i) { return a[i] + b[i]; });
}

void add_inplace(float* dst, const float* src, int64_t n) {
  map_indices(dst, n, [=](int64_t i) { return dst[i] + src[i]; });
}

void scale_inplace(float* x, float s, int64_t n) {
  map_indices(x, n, [=](int64_t i) { return x[i] * s; });
}

void add_bias(float* x, const float* bias, int64_t N, int64_t C) {
  parallel_for(N, grain_rows(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) accumulate(x + n * C, bias, C);
  });
}

void fill(float* x, float value, int64_t n) {
  map_indices(x, n, [=](int64_t) { return value; });
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  for_byte_chunks(bytes, [=](int64_t off, size_t len) {
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len);
  });
}

void fill_zero(void* x, size_t bytes) {
  for_byte_chunks(
      bytes, [=](int64_t off, size_t len) { std::memset(static_cast<char*>(x) + off, 0, len); });
}

void dropout(float* out, const float* inp, int64_t n, float p, uint64_t seed, uint64_t stream,
             int64_t global_offset) {
  const float scale = 1.0f / (1.0f - p);
  map_indices(out, n, [=](int64_t i) {
    const bool keep = rng::uniform(rng::key(seed, stream, global_offset + i)) >= p;
    return keep ? inp[i] * scale : 0.0f;
  });
}

}  // namespace llmt::cpu
