#!/usr/bin/env bash
# Installs the dependencies, builds and runs the whole test suite (CPU build), then configures
# and compiles the CUDA build once (when the toolkit is present) and runs its `gpu` tests, which
# skip cleanly without a GPU. Both builds treat warnings in project C++ code as errors.
# .ci/run calls exactly this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
llmt_install_deps
cd "$LLMT_ROOT"

llmt_build "$LLMT_ROOT/build" -DLLMTRAIN_CUDA=OFF -DLLMTRAIN_TESTS=ON -DLLMTRAIN_WERROR=ON
status=0
nvcc_path="$(llmt_nvcc)"
if [ -n "$nvcc_path" ]; then
  # Only what the CUDA build adds: the binary (with the CUDA kernels) and the GPU tests.
  LLMT_TARGETS="llmtrain test_gpu test_gpu_ops test_gpu_train" llmt_build "$LLMT_ROOT/build-cuda" -DLLMTRAIN_CUDA=ON \
    -DLLMTRAIN_WERROR=ON -DCMAKE_CUDA_COMPILER="$nvcc_path"
  (cd build-cuda && ctest -L gpu --output-on-failure) || status=1
else
  echo "==> no CUDA toolkit found: the CUDA build is not compiled"
fi
# The CPU suite last, so its summary line closes the output.
(cd build && ctest --output-on-failure -j "$(nproc)") || status=1
exit $status
