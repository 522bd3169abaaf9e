// Shared harness of the op tests (the shape of ggml's test-backend-ops): host tensors with seeded
// contents, comparison against double-precision references that reports the worst element, and a
// central-difference gradient checker, so every op file tests forward, backward and gradients
// alike.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace llmt::test {

// Host memory owned together with its Tensor view (a Tensor never owns). Copies are deep.
class HostTensor {
 public:
  HostTensor() = default;
  explicit HostTensor(Shape shape, DType dtype = DType::f32)
      : shape_(shape), dtype_(dtype), words_((shape.numel() * dtype_size(dtype) + 3) / 4, 0u) {}

  // The view; an absent Tensor for a default-constructed (or empty) HostTensor, so optional
  // arguments can be passed as `maybe.t()`.
  Tensor t() { return defined() ? Tensor(words_.data(), shape_, dtype_) : Tensor(); }
  bool defined() const { return !words_.empty(); }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_.numel(); }

  float* f32() { return Tensor(words_.data(), shape_, dtype_).f32(); }
  const float* f32() const { return const_cast<HostTensor*>(this)->f32(); }
  int32_t* i32() { return Tensor(words_.data(), shape_, dtype_).i32(); }
  const int32_t* i32() const { return const_cast<HostTensor*>(this)->i32(); }
  // Raw 16-bit storage of bf16 / f16 tensors.
  uint16_t* u16() {
    LLMT_CHECK(dtype_size(dtype_) == 2, "u16() of a ", dtype_name(dtype_), " tensor");
    return reinterpret_cast<uint16_t*>(words_.data());
  }
  const void* bytes() const { return words_.data(); }
  float& operator[](int64_t i) { return f32()[i]; }
  float operator[](int64_t i) const { return f32()[i]; }

 private:
  Shape shape_;
  DType dtype_ = DType::f32;
  std::vector<uint32_t> words_;  // 4-byte words: aligned for every dtype
};

// The stream of test data, apart from any stream the kernels use.
inline constexpr uint64_t kTestStream = 0x7e57;

// Uniform in [lo, hi), element i a pure function of (seed, i).
inline HostTensor uniform(Shape s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  HostTensor x(s);
  for (int64_t i = 0; i < x.numel(); ++i)
    x[i] = lo + (hi - lo) * rng::uniform(rng::key(seed, kTestStream, i));
  return x;
}

inline HostTensor normal(Shape s, uint64_t seed, float std = 1.0f) {
  HostTensor x(s);
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = std * rng::normal(rng::key(seed, kTestStream, i));
  return x;
}

inline HostTensor constant(Shape s, float value) {
  HostTensor x(s);
  std::fill(x.f32(), x.f32() + x.numel(), value);
  return x;
}

// i32 token ids in [0, V).
inline HostTensor tokens(Shape s, int32_t V, uint64_t seed) {
  HostTensor x(s, DType::i32);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.i32()[i] = static_cast<int32_t>(rng::key(seed, kTestStream, i) % static_cast<uint64_t>(V));
  return x;
}

inline std::vector<double> to_double(const HostTensor& x) {
  return std::vector<double>(x.f32(), x.f32() + x.numel());
}

// sum(out * w) in double: the scalar objective of gradient checks, whose gradient wrt out is w
// (so w doubles as `dout` for the backward under test).
inline double weighted_sum(const HostTensor& out, const HostTensor& w) {
  double s = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

struct Tol {
  double rtol = 1e-5;
  double atol = 1e-6;
};

// Passes when |got - want| <= atol + rtol * |want| everywhere (equal infinities pass, NaN fails);
// otherwise says how many differ and shows the worst element.
inline ::testing::AssertionResult all_close(const float* got, const double* want, int64_t n,
                                            Tol tol = {}) {
  int64_t bad = 0, worst = -1;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double g = got[i], w = want[i];
    if (g == w) continue;  // also equal infinities
    double diff = std::fabs(g - w), bound = tol.atol + tol.rtol * std::fabs(w);
    if (diff <= bound) continue;  // NaN never passes this comparison
    ++bad;
    double excess = std::isfinite(diff) ? diff / bound : INFINITY;
    if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << bad << " of " << n << " elements differ (rtol " << tol.rtol << ", atol " << tol.atol
     << "); worst at index " << worst << ": got " << got[worst] << ", want " << want[worst];
  return ::testing::AssertionFailure() << os.str();
}

inline ::testing::AssertionResult all_close(const HostTensor& got, const std::vector<double>& want,
                                            Tol tol = {}) {
  if (static_cast<int64_t>(want.size()) != got.numel())
    return ::testing::AssertionFailure()
           << "size " << got.numel() << " vs reference size " << want.size();
  return all_close(got.f32(), want.data(), got.numel(), tol);
}

inline ::testing::AssertionResult all_close(const HostTensor& got, const HostTensor& want,
                                            Tol tol = {}) {
  return all_close(got, to_double(want), tol);
}

// Bitwise equality of two tensors' storage (layout-independence and determinism checks).
inline ::testing::AssertionResult bits_equal(const HostTensor& a, const HostTensor& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype())
    return ::testing::AssertionFailure()
           << "shape/dtype differ: " << a.shape().str() << " vs " << b.shape().str();
  size_t bytes = static_cast<size_t>(a.numel()) * dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.bytes());
  const auto* pb = static_cast<const unsigned char*>(b.bytes());
  for (size_t i = 0; i < bytes; ++i)
    if (pa[i] != pb[i]) return ::testing::AssertionFailure() << "first differing byte " << i;
  return ::testing::AssertionSuccess();
}

// Test-name generator for INSTANTIATE_TEST_SUITE_P: the parameter's operator<< (which must print
// only letters, digits and '_').
struct ParamName {
  template <typename P>
  std::string operator()(const ::testing::TestParamInfo<P>& info) const {
    std::ostringstream os;
    os << info.param;
    return os.str();
  }
};

struct GradCheck {
  double eps = 1e-2;  // perturbation (the float-rounded step actually taken is used)
  double rtol = 1e-2;
  double atol = 1e-3;
  int64_t max_probes = 48;  // elements probed: all when numel <= max_probes, else a seeded subset
  uint64_t seed = 12345;
};

// Central differences on the f32 op: f() reruns the forward on the current contents of x and
// returns the scalar objective (in double, e.g. weighted_sum). analytic holds df/dx from the
// backward under test. x is restored afterwards. Fails naming the worst probed element.
inline ::testing::AssertionResult check_gradient(const std::function<double()>& f, HostTensor& x,
                                                 const HostTensor& analytic, GradCheck opt = {}) {
  const int64_t n = x.numel();
  if (analytic.numel() != n)
    return ::testing::AssertionFailure()
           << "analytic gradient has " << analytic.numel() << " elements, input " << n;
  std::vector<int64_t> probes;
  if (n <= opt.max_probes) {
    for (int64_t i = 0; i < n; ++i) probes.push_back(i);
  } else {
    for (int64_t k = 0; k < opt.max_probes; ++k)
      probes.push_back(static_cast<int64_t>(rng::key(opt.seed, kTestStream, k) % n));
  }
  int64_t bad = 0, worst = -1;
  double worst_excess = 0.0, worst_num = 0.0;
  for (int64_t i : probes) {
    const float x0 = x[i];
    const float xp = static_cast<float>(x0 + opt.eps), xm = static_cast<float>(x0 - opt.eps);
    x[i] = xp;
    double fp = f();
    x[i] = xm;
    double fm = f();
    x[i] = x0;
    double num = (fp - fm) / (static_cast<double>(xp) - xm);
    double ana = analytic[i];
    double diff = std::fabs(num - ana);
    double bound = opt.atol + opt.rtol * std::max(std::fabs(num), std::fabs(ana));
    if (diff <= bound) continue;
    ++bad;
    double excess = std::isfinite(diff) ? diff / bound : INFINITY;
    if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess, worst_num = num;
  }
  f();  // leave the forward's outputs as they were for the unperturbed input
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << bad << " of " << probes.size() << " probed gradient elements differ (eps " << opt.eps
     << ", rtol " << opt.rtol << ", atol " << opt.atol << "); worst at index " << worst
     << ": numeric " << worst_num << ", analytic " << analytic[worst];
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace llmt::test
