#!/usr/bin/env bash
# Installs the dependencies, builds and runs the whole test suite (CPU build), then configures
# and compiles the CUDA build once (when the toolkit is present) and runs its `gpu` tests, which
# skip cleanly without a GPU. Both builds treat warnings in project C++ code as errors. The unit
# tests also run under AddressSanitizer + UBSan, the data loader's under ThreadSanitizer.
# .ci/run calls exactly this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
llmt_install_deps test
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
# Sanitizers (LLMTRAIN_SANITIZE), on the unit-test programs only: every unit test under
# AddressSanitizer + UBSan; the data loader's prefetch thread and the background checkpoint
# writer under ThreadSanitizer (OpenMP's runtime is not instrumented, so TSan runs only tests that
# start no OpenMP region).
unit_targets="test_core test_ops test_model test_optim test_data test_config test_tensor_parallel"
unit_targets+=" test_mesh test_data_parallel test_checkpoint_layout test_checkpoint_save"
unit_targets+=" test_schedule test_p2p_matching test_config_loader"
LLMT_TARGETS="$unit_targets" llmt_build "$LLMT_ROOT/build-asan" -DLLMTRAIN_CUDA=OFF \
  -DLLMTRAIN_TESTS=ON -DLLMTRAIN_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build-asan && ctest -L unit -E "include_graph|^mpi_" -j "$(nproc)" --output-on-failure) ||
  status=1
LLMT_TARGETS="test_data test_checkpoint_save" llmt_build "$LLMT_ROOT/build-tsan" \
  -DLLMTRAIN_CUDA=OFF -DLLMTRAIN_TESTS=ON -DLLMTRAIN_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build-tsan && ctest -R "DataLoader|SaveTest" --output-on-failure) || status=1
# The CPU suite last, so its summary line closes the output.
(cd build && ctest --output-on-failure -j "$(nproc)") || status=1
exit $status
