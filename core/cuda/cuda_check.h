// LLMT_CUDA_CHECK: throws llmt::Error naming the file, line, call and CUDA's message when a CUDA
// runtime call fails. For CUDA sources only (.cu files and the NCCL backend), never included by
// an engine header that other code sees.
#pragma once

#include <cuda_runtime.h>

#include "core/check.h"

#define LLMT_CUDA_CHECK(call) LLMT_STATUS_CHECK(call, cudaSuccess, cudaGetErrorString)
