#!/usr/bin/env bash
# Muon against AdamW on the quickstart model and corpus (configs/quickstart.toml: GPT-2 shape,
# 4 layers, d_model 128, the fortunes corpus of scripts/corpus.sh) on 2 ranks (dp 2, one thread
# each, bound to cores), the same learning-rate schedule for both (Muon's update is scaled to
# AdamW's RMS, Moonlight): final training loss, validation loss, tokens/s, and the optimizer's
# bytes per rank, and the step at which the 10-step mean training loss first reaches AdamW's
# final one; then both at ZeRO-1 (Muon all-gathers each hidden matrix's rows).
#
#   scripts/bench/bench_muon.sh LLMTRAIN_BINARY [STEPS]     (default 200, the quickstart's)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}" "${2:-200}"
quickstart_bench

run() {
  local name="$1"
  shift
  bench_run "$name" 2 --set "train.steps=$steps" \
    --set train.threads=1 --set "data.path=$prefix" --set "data.tokenizer=$tokenizer" \
    --set "checkpoint.dir=$work/$name/checkpoints" --set checkpoint.interval=0 \
    --set "train.eval_interval=$steps" "$@"
}
run adamw
run muon --set optimizer.type=muon
run adamw_zero1 --set parallel.zero_stage=1
run muon_zero1 --set optimizer.type=muon --set parallel.zero_stage=1

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import json
import os
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions
work = sys.argv[1]
print(conditions())
print(f"{'run':<12} {'loss':>7} {'val_loss':>8} {'tokens/s':>9} {'vs adamw':>8} "
      f"{'optimizer MB/rank':>17} {'steps to adamw':>14}")
base = target = None
for name in ("adamw", "muon", "adamw_zero1", "muon_zero1"):
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    timed = [r["tokens_per_s"] for r in rows[2:] if "tokens_per_s" in r]
    tps = sorted(timed)[len(timed) // 2]  # the median step
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    # The training loss as a mean of 10 steps: the first step where it reaches AdamW's final one.
    mean = [sum(r["loss"] for r in rows[i - 9:i + 1]) / 10 for i in range(9, len(rows))]
    base = base or tps
    target = target or mean[-1]
    reach = next((rows[i + 9]["step"] for i, m in enumerate(mean) if m <= target), None)
    print(f"{name:<12} {rows[-1]['loss']:>7.4f} {val[-1] if val else float('nan'):>8.4f} "
          f"{tps:>9.0f} {tps / base:>8.3f} {rows[-1]['peak_bytes']['optimizer'] / 1e6:>17.3f} "
          f"{reach if reach else '-':>14}")
PY
