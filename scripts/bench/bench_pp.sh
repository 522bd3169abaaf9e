#!/usr/bin/env bash
# Pipeline-parallel scaling on one machine: tokens/s of pp=2 (two ranks under mpirun, one OpenMP
# thread each) per schedule against one rank (one thread) on the same global batch, and the
# measured bubble against the schedule's predicted one. Measured: each rank's idle time (waiting
# for activations and gradients) over its compute time in the step's schedule, averaged over
# the two ranks (metrics.jsonl pp_bubble); predicted: the simulator's, with backward = 2 forward
# (pp_bubble_predicted; (p-1)/m for GPipe and 1F1B, (p-1)/(v m) interleaved, (p-1)/(3m) ZB-H1,
# (p-1)/(6m) ZB-V).
# CPU s: user + sys of all ranks over the whole run (Open MPI busy-polls while a rank waits, so
# a pipeline's idle time shows up there too).
# m = 8 micro-batches of 4 per step; 4 layers, 2 per rank (interleaved and ZB-V: 1 per chunk,
# v = 2).
# Steps 1-2 are warm-up; a run's figures are the median over the remaining steps, and each run
# is repeated LLMT_BENCH_REPEAT times (default 2, interleaved) keeping the fastest.
#
#   scripts/bench/bench_pp.sh LLMTRAIN_BINARY [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

# GPT-2 shape, 4 layers, d_model 512, ~13.7M parameters (a 2048-token vocabulary: the head on
# the last stage costs about a third of a layer), 32 x 64 tokens per step.
bench_config 2048 512 8 64 32

for ((i = 0; i < ${LLMT_BENCH_REPEAT:-2}; i++)); do
  bench_run pp1.$i 1
  for s in gpipe 1f1b zb-h1; do
    bench_run "pp2_$s.$i" 2 --set parallel.pp=2 --set "parallel.pp_schedule=$s"
  done
  bench_run pp2_interleaved.$i 2 --set parallel.pp=2 --set parallel.pp_schedule=interleaved \
    --set parallel.virtual_stages=2
  bench_run pp2_zb-v.$i 2 --set parallel.pp=2 --set parallel.pp_schedule=zb-v \
    --set parallel.virtual_stages=2
done

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work = sys.argv[1]
KEYS = ("tokens_per_s", "step_time_s", "pp_bubble", "pp_bubble_predicted")
def run(name):
    return load(work, name, KEYS)
base = run("pp1")
print(conditions())
print(f"{'run':<26} {'tokens/s':>10} {'step s':>8} {'speedup':>8} {'efficiency':>10} "
      f"{'bubble':>8} {'predicted':>9} {'CPU s':>8}")
print(f"{'1 rank (1 thread)':<26} {base['tokens_per_s']:>10.0f} {base['step_time_s']:>8.3f} "
      f"{'':>8} {'':>10} {'':>8} {'':>9} {base['cpu_s']:>8.1f}")
for s in ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"):
    m = run(f"pp2_{s}")
    sp = m["tokens_per_s"] / base["tokens_per_s"]
    print(f"{'pp=2 ' + s:<26} {m['tokens_per_s']:>10.0f} {m['step_time_s']:>8.3f} {sp:>8.2f} "
          f"{sp / 2:>10.1%} {m['pp_bubble']:>8.3f} {m['pp_bubble_predicted']:>9.3f} "
          f"{m['cpu_s']:>8.1f}")
PY
