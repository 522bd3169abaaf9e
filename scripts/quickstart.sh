#!/usr/bin/env bash
# Installs the dependencies, builds llmtrain (CPU) and trains configs/quickstart.toml under
# mpirun. Extra arguments go to `llmtrain train` (e.g. --set train.steps=50).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
llmt_install_deps
LLMT_TARGETS=llmtrain llmt_build "$LLMT_ROOT/build" -DLLMTRAIN_CUDA=OFF
cd "$LLMT_ROOT"
llmt_mpirun -np "${LLMT_RANKS:-1}" ./build/app/llmtrain train --config configs/quickstart.toml "$@"
