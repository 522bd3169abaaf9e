#!/usr/bin/env bash
# ZeRO++'s quantised weight all-gather (parallel.zero_quantized_weights, qwZ) against plain ZeRO-3
# on the quickstart model and corpus (configs/quickstart.toml, the fortunes corpus of
# scripts/corpus.sh) at dp 2 in bf16, LLMTRAIN_CPU_BF16_GEMM=blas for every run: per run the final
# training and validation loss, the largest per-step loss difference to plain ZeRO-3 and the last
# 10 steps' mean relative difference, beside the noise of splitting the same batches into
# micro-batches of 4 instead of 8 (the issue's yardstick: qwZ's drift within 2x of it); the
# all-gather bytes per step (rank 0's counters) and tokens/s against plain ZeRO-3.
#
#   scripts/bench/bench_zeropp.sh LLMTRAIN_BINARY [STEPS]     (default 200, the quickstart's)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}" "${2:-200}"
quickstart_bench
export LLMTRAIN_CPU_BF16_GEMM=blas

run() {
  local name="$1"
  shift
  bench_run "$name" 2 --set "train.steps=$steps" --set train.precision=bf16 \
    --set train.threads=1 --set parallel.dp=2 --set parallel.zero_stage=3 \
    --set "data.path=$prefix" --set "data.tokenizer=$tokenizer" \
    --set "checkpoint.dir=$work/$name/checkpoints" --set checkpoint.interval=0 \
    --set "train.eval_interval=$steps" "$@"
}
run zero3
run zero3_mbs4 --set train.micro_batch_size=4
run qwz --set parallel.zero_quantized_weights=true
run qwz_block64 --set parallel.zero_quantized_weights=true --set parallel.zero_quant_block=64

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
for name in ("zero3", "zero3_mbs4", "qwz", "qwz_block64"):
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        runs[name] = [json.loads(line) for line in f]
base = runs["zero3"]
tps0 = statistics.median(r["tokens_per_s"] for r in base[2:])
gather0 = base[-1]["comm_bytes"]["dp"]["all_gather"]
print(f"{'run':<12} {'loss':>7} {'val_loss':>8} {'max |dloss|':>11} {'max rel':>8} "
      f"{'last-10 rel':>11} {'all-gather B':>12} {'vs zero3':>8} {'tokens/s':>9} {'vs zero3':>8}")
for name, rows in runs.items():
    d = [abs(a["loss"] - b["loss"]) for a, b in zip(rows, base)]
    rel = [abs(a["loss"] / b["loss"] - 1) for a, b in zip(rows, base)]
    last = sum(r["loss"] for r in rows[-10:]) / sum(r["loss"] for r in base[-10:]) - 1
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    tps = statistics.median(r["tokens_per_s"] for r in rows[2:])
    gather = rows[-1]["comm_bytes"]["dp"]["all_gather"]
    print(f"{name:<12} {rows[-1]['loss']:>7.4f} {val[-1] if val else float('nan'):>8.4f} "
          f"{max(d):>11.4f} {max(rel):>8.2e} {last:>+11.2e} {gather:>12} {gather / gather0:>8.3f} "
          f"{tps:>9.0f} {tps / tps0:>8.3f}")
PY
