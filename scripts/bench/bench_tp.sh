#!/usr/bin/env bash
# Tensor-parallel scaling on one machine: tokens/s of tp=2 (two ranks under mpirun, one OpenMP
# thread each), with and without sequence parallelism, against tp=1 (one rank, one thread) on
# the same global batch, and the scaling efficiency. TP collectives are blocking (nothing is
# hidden behind compute), so the gap to 100% is communication plus the work tp does not split
# (norms, residuals and dropout without SP; the cross-entropy statistics).
# Steps 1-2 are warm-up; a run's figures are the median over the remaining steps, and each run
# is repeated LLMT_BENCH_REPEAT times (default 2, interleaved) keeping the fastest.
#
#   scripts/bench/bench_tp.sh LLMTRAIN_BINARY [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

# GPT-2 shape, 4 layers, d_model 256, ~3.4M parameters, 16 x 256 tokens per step.
bench_config 2048 256 4 256 16

for ((i = 0; i < ${LLMT_BENCH_REPEAT:-2}; i++)); do
  bench_run tp1.$i 1
  bench_run tp2.$i 2 --set parallel.tp=2
  bench_run tp2_sp.$i 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
done

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work = sys.argv[1]
KEYS = ("tokens_per_s", "step_time_s")
def tp_extra(rows):  # this step's tp traffic and peak activation bytes, from the last step
    return {"tp_bytes": sum(rows[-1].get("comm_bytes", {}).get("tp", {}).values()),
            "activations": rows[-1]["peak_bytes"]["activations"]}
def run(name):
    return load(work, name, KEYS, tp_extra)
base = run("tp1")
print(conditions())
print(f"{'run':<24} {'tokens/s':>10} {'step s':>8} {'speedup':>8} {'efficiency':>10} "
      f"{'tp MB/step':>10} {'activations MB':>14}")
for name, label, ranks in [("tp1", "tp=1 (1 thread)", 1), ("tp2", "tp=2", 2),
                           ("tp2_sp", "tp=2 + sequence parallel", 2)]:
    m = run(name)
    sp = m["tokens_per_s"] / base["tokens_per_s"]
    print(f"{label:<24} {m['tokens_per_s']:>10.0f} {m['step_time_s']:>8.3f} {sp:>8.2f} "
          f"{sp / ranks:>10.1%} {m['tp_bytes'] / 1e6:>10.1f} {m['activations'] / 1e6:>14.1f}")
PY
