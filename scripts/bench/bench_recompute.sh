#!/usr/bin/env bash
# Activation recompute on the GPT-2 124M shape (configs/gpt2-124m.toml) at 1 x 1024 tokens per
# step, one rank using every core: step time and peak activation bytes of recompute = "none",
# "selective" (the attention core), "selective" of the norms and the activation
# (recompute_modules = ["layernorm", "act"], "norm+act") and "full", and their ratios to "none".
# Full recompute reruns each layer's forward in backward (expect about 4/3 of the step time);
# selective reruns only the attention core, or only the norms and GELU (no matmul).
# Steps 1-2 are warm-up; a run's figures are the median over the remaining steps, and each run is
# repeated LLMT_BENCH_REPEAT times (default 1, interleaved) keeping the fastest.
#
#   scripts/bench/bench_recompute.sh LLMTRAIN_BINARY [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}" "${2:-6}"

cp "$(dirname "${BASH_SOURCE[0]}")/../../configs/gpt2-124m.toml" "$work/bench.toml"
sets=(--set train.steps="$steps" --set train.global_batch_size=1 --set train.micro_batch_size=1
      --set log.progress=false)
for ((i = 0; i < ${LLMT_BENCH_REPEAT:-1}; i++)); do
  for mode in none selective full; do
    bench_run "$mode.$i" 1 "${sets[@]}" --set train.recompute="$mode"
  done
  bench_run "norm+act.$i" 1 "${sets[@]}" --set train.recompute=selective \
    --set 'train.recompute_modules=["layernorm", "act"]'
done

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work = sys.argv[1]
def peaks(rows):
    return {"activations": rows[-1]["peak_bytes"]["activations"]}
runs = {m: load(work, m, ("tokens_per_s", "step_time_s"), peaks)
        for m in ("none", "selective", "norm+act", "full")}
base = runs["none"]
print(conditions())
print(f"{'recompute':<10} {'step s':>8} {'tokens/s':>9} {'time ratio':>10} {'activations MB':>15} "
      f"{'memory ratio':>12}")
for m, r in runs.items():
    print(f"{m:<10} {r['step_time_s']:>8.2f} {r['tokens_per_s']:>9.0f} "
          f"{r['step_time_s'] / base['step_time_s']:>10.2f} {r['activations'] / 1e6:>15.1f} "
          f"{r['activations'] / base['activations']:>12.3f}")
PY
