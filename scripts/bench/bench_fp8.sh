#!/usr/bin/env bash
# FP8 GEMM inputs (train.fp8, emulated) against bf16 on the quickstart model and corpus
# (configs/quickstart.toml: GPT-2 shape, 4 layers, d_model 128, the fortunes corpus of
# scripts/corpus.sh) on one rank, LLMTRAIN_CPU_BF16_GEMM=blas for every run (the FP8 GEMMs are
# fp32 GEMMs on dequantised values; the bf16 run then multiplies on the same sgemm): per run the
# final training and validation loss, the largest per-step loss difference to bf16 (absolute and
# relative) and the last 10 steps' mean relative difference, beside the noise of splitting the
# same batches into micro-batches of 4 instead of 8; and tokens/s against bf16 (the cost of the
# emulation: quantising each GEMM input into scratch).
#
#   scripts/bench/bench_fp8.sh LLMTRAIN_BINARY [STEPS]     (default 200, the quickstart's)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}" "${2:-200}"
quickstart_bench
export LLMTRAIN_CPU_BF16_GEMM=blas

run() {
  local name="$1"
  shift
  bench_run "$name" 1 --set "train.steps=$steps" --set train.precision=bf16 \
    --set train.threads=1 --set "data.path=$prefix" --set "data.tokenizer=$tokenizer" \
    --set "checkpoint.dir=$work/$name/checkpoints" --set checkpoint.interval=0 \
    --set "train.eval_interval=$steps" "$@"
}
run bf16
run bf16_mbs4 --set train.micro_batch_size=4
run blockwise --set train.fp8=blockwise
run tensorwise --set train.fp8=tensorwise

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, drift
print(conditions())
print(f"{'run':<11} {'loss':>7} {'val_loss':>8} {'max |dloss|':>11} {'max rel':>8} "
      f"{'last-10 rel':>11} {'tokens/s':>9} {'vs bf16':>7}")
for name, d in drift(sys.argv[1], ["bf16", "bf16_mbs4", "blockwise", "tensorwise"]).items():
    print(f"{name:<11} {d['loss']:>7.4f} {d['val_loss']:>8.4f} {d['max_d']:>11.4f} "
          f"{d['max_rel']:>8.2e} {d['last10']:>+11.2e} {d['tokens_per_s']:>9.0f} {d['speed']:>7.3f}")
PY
