// Element types and devices. Compute on the CPU backend is fp32; bf16/f16 are storage types
// (checkpoints, GPU) and the target of rounding in mixed-precision emulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace llmt {

// f64: host scalars only (sums of squares reduced across ranks), never a compute tensor.
enum class DType : uint8_t { f32, bf16, f16, i32, f64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::f64:
      return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::f64:
      return "f64";
  }
  return "?";
}

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

constexpr std::string_view device_name(DeviceKind k) {
  return k == DeviceKind::cpu ? "cpu" : "cuda";
}

}  // namespace llmt
