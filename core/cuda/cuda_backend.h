// The CUDA DeviceBackend: stream-ordered device memory, pinned host memory, copies and a compute
// stream per backend. Engine headers see only the DeviceBackend interface (no CUDA types).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "core/allocator.h"
#include "core/peak_flops.h"

namespace llmt {

// Binds `device_index`; throws llmt::Error naming the reason (no driver, no such GPU).
std::unique_ptr<DeviceBackend> make_cuda_backend(int device_index);

// Number of visible GPUs; 0 when there is no driver or no device (never throws).
int cuda_device_count();

// Free and total bytes of GPU `device_index` (cudaMemGetInfo; creates the device's context);
// {-1, -1} when there is no driver or no such device (never throws).
std::pair<double, double> cuda_memory_info(int device_index);

// Name, compute capability, SM count and maximum SM clock of GPU `device_index`, from the driver.
GpuInfo cuda_gpu_info(int device_index);

// The one compute stream of this process (a cudaStream_t, opaque here so that no CUDA type
// reaches an engine header), created on first use on the current device. The backend's copies
// and every kernel in kernels/cuda run on it, so they are ordered without extra events.
void* cuda_compute_stream();

// "CUDA 13.0, cuBLASLt 13.1.0, ..., driver 13.0": the versions compiled against, and the
// driver's (or that none was found).
std::string cuda_version_info();

}  // namespace llmt
