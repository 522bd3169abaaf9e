// LLMT_HOST_DEVICE: __host__ __device__ when nvcc compiles the including file, nothing otherwise,
// for the plain C++ math written once for the CPU and CUDA kernels (adamw_math.h, moe_math.h).
#pragma once

#ifdef __CUDACC__
#define LLMT_HOST_DEVICE __host__ __device__
#else
#define LLMT_HOST_DEVICE
#endif
