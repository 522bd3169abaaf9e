// Counter-based random numbers: a value is a pure function of its key (seed, stream, index), so
// initialisation and dropout give the same numbers whatever the parallel layout, with no state
// to carry. The mixer is SplitMix64's finaliser applied to a combined key.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace llmt::rng {

constexpr uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Stable 64-bit hash of a name (FNV-1a then mixed): parameter names become RNG streams.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return mix64(h);
}

constexpr uint64_t key(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream)) + index);
}

// Uniform in [0, 1) with 24 random bits.
inline float uniform(uint64_t k) {
  return static_cast<float>(k >> 40) * (1.0f / 16777216.0f);
}

// Standard normal from one 64-bit key (Box-Muller on its two 32-bit halves).
inline float normal(uint64_t k) {
  double u1 = (static_cast<double>(k >> 32) + 1.0) * (1.0 / 4294967297.0);  // (0, 1)
  double u2 = static_cast<double>(k & 0xffffffffULL) * (1.0 / 4294967296.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace llmt::rng
