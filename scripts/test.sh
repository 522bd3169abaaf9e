#!/usr/bin/env bash
# Installs the dependencies, builds and runs the whole test suite (CPU build), then configures
# and compiles the CUDA build once (when the toolkit is present) and runs its `gpu` tests, which
# skip cleanly without a GPU. Both builds treat warnings in project C++ and CUDA code as errors.
# The unit tests (ctest label `unit`: the `unit_tests` build target) also run under
# AddressSanitizer + UBSan, the data loader's and the checkpoint writer's under ThreadSanitizer.
# Prints each stage's wall time at the end, then repeats ctest's summary line of the CPU suite so
# that it closes the output. .ci/run calls exactly this.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$LLMT_ROOT"

status=0
stage_names=()
stage_secs=()
# stage NAME COMMAND...: runs COMMAND, records its wall time, and remembers a failure (the
# remaining stages still run, so one run reports every failing stage).
stage() {
  local name="$1" start=$SECONDS rc=0
  shift
  echo "==> stage: $name"
  "$@" || rc=$?
  stage_names+=("$name")
  stage_secs+=($((SECONDS - start)))
  if [ $rc -ne 0 ]; then
    echo "==> stage $name failed (exit $rc)"
    status=1
  fi
}

cuda_build() {
  # Only what the CUDA build adds: the binary (with the CUDA kernels) and the GPU tests.
  LLMT_TARGETS="llmtrain test_gpu test_gpu_ops test_gpu_train" llmt_build "$LLMT_ROOT/build-cuda" \
    -DLLMTRAIN_CUDA=ON -DLLMTRAIN_WERROR=ON -DLLMTRAIN_DNNL=OFF -DCMAKE_CUDA_COMPILER="$nvcc_path"
}
# With a GPU, ctest runs every case as its own test. Without one, each case would only skip, and
# a process that loads the CUDA libraries takes ~0.4 s to start (219 cases: 85 s): each program
# runs once instead, its cases skipping with the message.
gpu_tests() {
  if nvidia-smi -L >/dev/null 2>&1; then
    (cd build-cuda && ctest -L gpu -j "$(nproc)" --output-on-failure)
  else
    echo "==> no GPU visible: each GPU test program runs once, its cases skipping"
    local t
    for t in test_gpu test_gpu_ops test_gpu_train; do
      build-cuda/tests/gpu/$t --gtest_brief=1 || return 1
    done
  fi
}
# Sanitizers (LLMTRAIN_SANITIZE) on the unit-test programs: every program of `unit_tests` under
# AddressSanitizer + UBSan; the data loader's prefetch thread and the background checkpoint
# writer under ThreadSanitizer (OpenMP's runtime is not instrumented, so TSan runs only tests that
# start no OpenMP region). ctest's `mpi` label needs the binary and MPI: not built here. -O1 -g1
# (line tables: reports keep file and line) compiles in half the time of -O2 -g (trainer.cpp
# under ASan + UBSan: 17.6 s against 34.7 s).
sanitizer_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
asan_build() {
  LLMT_TARGETS="unit_tests" llmt_build "$LLMT_ROOT/build-asan" -DLLMTRAIN_CUDA=OFF \
    -DLLMTRAIN_TESTS=ON -DLLMTRAIN_SANITIZE=address,undefined "${sanitizer_flags[@]}"
}
asan_tests() {
  (cd build-asan && ctest -L unit -LE mpi -E include_graph -j "$(nproc)" --output-on-failure)
}
tsan_build() {
  LLMT_TARGETS="test_data test_checkpoint_save" llmt_build "$LLMT_ROOT/build-tsan" \
    -DLLMTRAIN_CUDA=OFF -DLLMTRAIN_TESTS=ON -DLLMTRAIN_SANITIZE=thread "${sanitizer_flags[@]}"
}
tsan_tests() { (cd build-tsan && ctest -R "DataLoader|SaveTest" --output-on-failure); }
cpu_tests() {
  (cd build && ctest --output-on-failure -j "$(nproc)") 2>&1 | tee "$LLMT_ROOT/build/ctest.log"
  return "${PIPESTATUS[0]}"
}

stage deps llmt_install_deps test
stage cpu-build llmt_build "$LLMT_ROOT/build" -DLLMTRAIN_CUDA=OFF -DLLMTRAIN_TESTS=ON \
  -DLLMTRAIN_WERROR=ON
nvcc_path="$(llmt_nvcc)"
if [ -n "$nvcc_path" ]; then
  stage cuda-build cuda_build
  stage gpu-tests gpu_tests
else
  echo "==> no CUDA toolkit found: the CUDA build is not compiled"
fi
stage asan-build asan_build
stage asan-tests asan_tests
stage tsan-build tsan_build
stage tsan-tests tsan_tests
# The CPU suite last; its summary line closes the output (repeated after the stage times).
stage cpu-tests cpu_tests

echo "==> stage times (s):"
total=0
for i in "${!stage_names[@]}"; do
  printf '    %-11s %5d\n' "${stage_names[$i]}" "${stage_secs[$i]}"
  total=$((total + stage_secs[i]))
done
printf '    %-11s %5d\n' total "$total"
if [ -f build/ctest.log ]; then
  grep -E "^Total Test time" build/ctest.log || true
  grep -E "tests passed, [0-9]+ tests failed out of" build/ctest.log || true
fi
exit $status
