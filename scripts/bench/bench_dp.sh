#!/usr/bin/env bash
# Data-parallel scaling on one machine: tokens/s of dp=2 (two ranks under mpirun, one OpenMP
# thread each) against dp=1 (one rank, one thread) on the same global batch, the scaling
# efficiency, and how much of the gradient all-reduce was hidden behind backward:
#   exposed = time blocked on handles with small buckets (overlapped with backward),
#   total   = the same with one bucket, started only when backward has finished (nothing hidden),
#   hidden  = 1 - exposed / total.
# Also the CPU time of all ranks over the whole run (startup included), whose ratio is the work
# efficiency; it is less sensitive than wall time to other load on the machine (Open MPI's
# busy-polling while waiting counts as CPU time).
# Steps 1-2 are warm-up; a run's figures are the median over the remaining steps, and each run
# is repeated LLMT_BENCH_REPEAT times (default 2, interleaved) keeping the fastest, because a
# shared 2-core machine is noisy (the load average is printed with the results).
#
#   scripts/bench/bench_dp.sh LLMTRAIN_BINARY [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

# GPT-2 shape, 16.8M parameters (67 MB of fp32 gradients: 13.1M of them in the 8192 x 512
# embedding), 8 x 64 tokens per step: a short sequence, so the gradient all-reduce is a visible
# share of the step and its overlap with backward can be measured.
bench_config 8192 512 8 64 8

for ((i = 0; i < ${LLMT_BENCH_REPEAT:-2}; i++)); do
  bench_run dp1.$i 1
  bench_run dp2.$i 2 --set parallel.bucket_mb=1
  bench_run dp2_one_bucket.$i 2 --set parallel.bucket_mb=1000
  bench_run zero1.$i 2 --set parallel.zero_stage=1
  bench_run zero3.$i 2 --set parallel.zero_stage=3
done

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work = sys.argv[1]
KEYS = ("tokens_per_s", "step_time_s", "comm_wait_s")
def run(name):
    return load(work, name, KEYS)
base = run("dp1")
print(conditions())
print(f"{'run':<28} {'tokens/s':>10} {'step s':>8} {'comm wait s':>12} {'speedup':>8} "
      f"{'efficiency':>10} {'CPU s':>8} {'CPU eff.':>9}")
for name, label in [("dp1", "dp=1 (1 thread)"), ("dp2", "dp=2 DDP, 1 MB buckets"),
                    ("dp2_one_bucket", "dp=2 DDP, one bucket"), ("zero1", "dp=2 ZeRO-1"),
                    ("zero3", "dp=2 ZeRO-3")]:
    m = run(name)
    ranks = 1 if name == "dp1" else 2
    sp = m["tokens_per_s"] / base["tokens_per_s"]
    print(f"{label:<28} {m['tokens_per_s']:>10.0f} {m['step_time_s']:>8.3f} {m['comm_wait_s']:>12.4f} "
          f"{sp:>8.2f} {sp / ranks:>10.1%} {m['cpu_s']:>8.1f} {base['cpu_s'] / m['cpu_s']:>9.1%}")
exposed, total = run("dp2")["comm_wait_s"], run("dp2_one_bucket")["comm_wait_s"]
print(f"all-reduce time exposed with 1 MB buckets: {exposed:.4f} s of {total:.4f} s "
      f"(one bucket after backward): {1 - exposed / total:.0%} hidden behind backward")
PY
