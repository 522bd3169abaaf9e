// LLMT_CUBLAS_CHECK: throws llmt::Error naming the file, line, call and cuBLAS's message when a
// cuBLAS or cuBLASLt call fails (both return cublasStatus_t). For the CUDA kernels only.
#pragma once

#include <cublas_api.h>

#include "core/check.h"

#define LLMT_CUBLAS_CHECK(call) \
  LLMT_STATUS_CHECK(call, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
