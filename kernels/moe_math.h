// Group-limited routing's group score (DeepSeek-V3), written once for the CPU router
// (kernels/cpu/moe.cpp) and the CUDA one (kernels/cuda/moe.cu), so the two cannot drift apart.
// Plain C++ that nvcc also compiles as __host__ __device__; included only by kernel sources.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace llmt::kernel_math {

// The score of the group of experts [first, first + per): the sum of its two largest keys
// (key(e): score + bias), or its one key when it holds one expert.
template <typename Key>
LLMT_HOST_DEVICE inline float group_score(const Key& key, int64_t first, int64_t per) {
  float top = -INFINITY, second = -INFINITY;
  for (int64_t e = first; e < first + per; ++e) {
    const float v = key(e);
    if (v > top) {
      second = top;
      top = v;
    } else if (v > second) {
      second = v;
    }
  }
  return per > 1 ? top + second : top;
}

}  // namespace llmt::kernel_math
