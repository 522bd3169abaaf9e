// An FP8 quantiser for the tests, written apart from kernels/fp8_math.h: every finite value of a
// format decoded from its 8-bit codes, the nearest one found by search (a tie goes to the code
// with an even mantissa), and a tile's scale and dequantisation spelled out in float arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace llmt::test {

// The non-negative finite values of E4M3 ("fn": exponent bias 7, the all-ones code NaN) or E5M2
// (bias 15, exponent 31 inf/NaN), ascending, with their codes.
struct Fp8Table {
  std::vector<double> value;
  std::vector<int> code;
  double max = 0;
};

inline Fp8Table make_fp8_table(bool e5m2) {
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  Fp8Table t;
  for (int code = 0; code < 128; ++code) {
    const int e = code >> mbits, m = code & ((1 << mbits) - 1);
    if (e5m2 && e == 31) continue;
    if (!e5m2 && code == 127) continue;
    const double frac = static_cast<double>(m) / (1 << mbits);
    t.value.push_back(e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1 + frac, e - bias));
    t.code.push_back(code);
  }
  t.max = t.value.back();
  return t;
}

inline const Fp8Table& fp8_table(bool e5m2) {
  static const Fp8Table e4m3 = make_fp8_table(false), e5 = make_fp8_table(true);
  return e5m2 ? e5 : e4m3;
}

// v rounded to the nearest value of the format, ties to the even code, beyond max to max.
inline float fp8_nearest(float v, bool e5m2) {
  const Fp8Table& t = fp8_table(e5m2);
  const double a = std::fabs(static_cast<double>(v));
  double r = t.max;
  if (a < t.max) {
    const size_t hi =
        static_cast<size_t>(std::lower_bound(t.value.begin(), t.value.end(), a) - t.value.begin());
    const size_t lo = hi == 0 ? 0 : hi - 1;
    const double dlo = a - t.value[lo], dhi = t.value[hi] - a;
    const bool up = dhi < dlo || (dhi == dlo && t.code[hi] % 2 == 0);
    r = t.value[up ? hi : lo];
  }
  return static_cast<float>(v < 0 ? -r : r);
}

// The largest |value| of the tile of x (M,K) whose first element is (i0, k0), tiles tr x tc.
inline float fp8_tile_amax(const float* x, int64_t M, int64_t K, int64_t i0, int64_t k0, int64_t tr,
                           int64_t tc) {
  float amax = 0;
  for (int64_t i = i0; i < std::min(M, i0 + tr); ++i)
    for (int64_t k = k0; k < std::min(K, k0 + tc); ++k)
      amax = std::max(amax, std::fabs(x[i * K + k]));
  return amax;
}

// x (M,K) quantised in tiles of tr x tc: each tile's amax, s = amax / max (float), s * fp8(v / s)
// (float), 0 where amax is 0.
inline std::vector<float> fp8_reference(const float* x, int64_t M, int64_t K, int64_t tr,
                                        int64_t tc, bool e5m2) {
  std::vector<float> out(static_cast<size_t>(M * K));
  const float fmax = static_cast<float>(fp8_table(e5m2).max);
  for (int64_t i0 = 0; i0 < M; i0 += tr)
    for (int64_t k0 = 0; k0 < K; k0 += tc) {
      const float amax = fp8_tile_amax(x, M, K, i0, k0, tr, tc);
      const float s = amax / fmax;
      for (int64_t i = i0; i < std::min(M, i0 + tr); ++i)
        for (int64_t k = k0; k < std::min(K, k0 + tc); ++k)
          out[static_cast<size_t>(i * K + k)] =
              amax > 0 ? s * fp8_nearest(x[i * K + k] / s, e5m2) : 0.0f;
    }
  return out;
}

}  // namespace llmt::test
