// The mesh's named axes, fastest-varying first (Megatron order: tensor parallelism stays inside a
// node). Shared by the Mesh (groups per axis) and Placement (a parameter's layout per axis).
#pragma once

#include <cstdint>
#include <string_view>

namespace llmt {

enum class Axis : uint8_t { tp, cp, dp, pp };
constexpr int kNumAxes = 4;
std::string_view axis_name(Axis a);

}  // namespace llmt
