// The CUDA DeviceBackend: cudaMalloc'd memory, copies and a compute stream per backend. Only
// this folder includes <cuda_runtime.h>; engine headers see the DeviceBackend interface.
#pragma once

#include <memory>

#include "engine/core/allocator.h"

namespace llmt {

// Binds `device_index`; throws llmt::Error naming the reason (no driver, no such GPU).
std::unique_ptr<DeviceBackend> make_cuda_backend(int device_index);

// Number of visible GPUs; 0 when there is no driver or no device (never throws).
int cuda_device_count();

}  // namespace llmt
