// One call of every op in kernels/ops.h on seeded inputs, defined once and run on any device:
// the CPU op tests check the table itself (it covers every op, it runs, the device round trip is
// exact), and the GPU suite (tests/gpu) runs each case on CUDA and compares every tensor with the
// CPU kernel's result on the same inputs. Cases are host tensors plus a call on their views, so
// the same definition drives host memory and device copies alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "tests/unit/ops/harness.h"

namespace llmt::test {

struct OpCase {
  std::string op;    // the function in kernels/ops.h that this case calls
  std::string name;  // unique test name: letters, digits, '_'
  // The arguments, inputs and outputs alike (outputs seeded too, so "assigned" and "added into"
  // both show); an absent HostTensor stands for an absent optional argument.
  std::vector<HostTensor> args;
  // Calls the op on views of args (same order, same device); returns its scalar results, if any.
  std::function<std::vector<double>(const std::vector<Tensor>&)> call;
  Tol tol;  // CUDA vs CPU on fp32 data, per element of every tensor and scalar
};

std::vector<OpCase> op_cases();

// The scores' scale of the attention cases named "..._scaled...": YaRN's factor on 1/sqrt(D)
// (DeepSeek-V3's m(40, 1)^2 = 1.874).
inline float scaled_attention_scale(int64_t D) {
  return 1.8738f / std::sqrt(static_cast<float>(D));
}

// What a run leaves behind: every argument's contents, and the scalar results.
struct OpResult {
  std::vector<HostTensor> args;
  std::vector<double> scalars;
};

// Runs c on copies of its arguments: in host memory when device is null, else in buffers of that
// allocator (copied in, called, copied back).
OpResult run_case(const OpCase& c, Allocator* device = nullptr);

// The bf16-storage variant of a case, as mixed-precision training runs ops: its f32 inputs
// rounded to bf16 first, and after the call every f32 tensor rounded to bf16 (ops::round_to on
// the run's device). The CPU and CUDA runs then agree to the case's fp32 tolerance plus one bf16
// ulp (a rounding boundary falling between the two fp32 results): the variant's tol adds kBf16Tol.
OpCase bf16_storage(const OpCase& c);
inline constexpr Tol kBf16Tol{1.0 / 128, 1e-5};

// got vs want, tensor by tensor (i32 tensors exactly) and scalar by scalar, within tol.
::testing::AssertionResult results_close(const OpResult& got, const OpResult& want, Tol tol);

}  // namespace llmt::test
