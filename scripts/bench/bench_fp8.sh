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
import json
import os
import statistics
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions
work = sys.argv[1]
print(conditions())
runs = {}
for name in ("bf16", "bf16_mbs4", "blockwise", "tensorwise"):
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        runs[name] = [json.loads(line) for line in f]
base = runs["bf16"]
tps0 = statistics.median(r["tokens_per_s"] for r in base[2:])
print(f"{'run':<11} {'loss':>7} {'val_loss':>8} {'max |dloss|':>11} {'max rel':>8} "
      f"{'last-10 rel':>11} {'tokens/s':>9} {'vs bf16':>7}")
for name, rows in runs.items():
    d = [abs(a["loss"] - b["loss"]) for a, b in zip(rows, base)]
    rel = [abs(a["loss"] / b["loss"] - 1) for a, b in zip(rows, base)]
    last = sum(r["loss"] for r in rows[-10:]) / sum(r["loss"] for r in base[-10:]) - 1
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    tps = statistics.median(r["tokens_per_s"] for r in rows[2:])
    print(f"{name:<11} {rows[-1]['loss']:>7.4f} {val[-1] if val else float('nan'):>8.4f} "
          f"{max(d):>11.4f} {max(rel):>8.2e} {last:>+11.2e} {tps:>9.0f} {tps / tps0:>7.3f}")
PY
