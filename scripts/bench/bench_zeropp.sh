#!/usr/bin/env bash
# ZeRO++'s quantised weight all-gather (parallel.zero_quantized_weights, qwZ) and quantised
# gradient reduce-scatter (parallel.zero_quantized_gradients, qgZ: one int4 all-to-all at dp 2;
# two with hpZ 1, first within each rank, then across) against plain ZeRO-3 on the quickstart model and corpus (configs/quickstart.toml, the fortunes corpus of
# scripts/corpus.sh) at dp 2 in bf16, LLMTRAIN_CPU_BF16_GEMM=blas for every run: per run the final
# training and validation loss, the largest per-step loss difference to plain ZeRO-3 and the last
# 10 steps' mean relative difference, beside the noise of splitting the same batches into
# micro-batches of 4, 2 and 1 instead of 8 (each quantised run's drift against the largest of
# those); the all-gather bytes and the gradients' reduce-scatter + all-to-all bytes per step
# (rank 0's counters) and tokens/s against plain ZeRO-3.
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
for m in 4 2 1; do run "zero3_mbs$m" --set "train.micro_batch_size=$m"; done
run qwz --set parallel.zero_quantized_weights=true
run qwz_block64 --set parallel.zero_quantized_weights=true --set parallel.zero_quant_block=64
run qgz --set parallel.zero_quantized_gradients=true
run qgz_hpz1 --set parallel.zero_quantized_gradients=true --set parallel.zero_hierarchical_partition=1
run qwz_qgz --set parallel.zero_quantized_weights=true --set parallel.zero_quantized_gradients=true

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, drift
print(conditions())
splits = ["zero3_mbs4", "zero3_mbs2", "zero3_mbs1"]
quantised = ["qwz", "qwz_block64", "qgz", "qgz_hpz1", "qwz_qgz"]
runs = drift(sys.argv[1], ["zero3"] + splits + quantised)


def grads(d):
    """The gradients' bytes: reduce-scatter over dp, or qgZ's all-to-alls (over dp, or over the
    groups of one rank and dp_replica)."""
    return sum(kinds.get(k, 0) for name, kinds in d["last"]["comm_bytes"].items()
               for k in ("reduce_scatter", "all_to_all") if name.startswith("dp"))


gather0 = runs["zero3"]["last"]["comm_bytes"]["dp"]["all_gather"]
grads0 = grads(runs["zero3"])
print(f"{'run':<12} {'loss':>7} {'val_loss':>8} {'max |dloss|':>11} {'max rel':>8} "
      f"{'last-10 rel':>11} {'all-gather B':>12} {'vs zero3':>8} {'gradient B':>10} "
      f"{'vs zero3':>8} {'tokens/s':>9} {'vs zero3':>8}")
for name, d in runs.items():
    gather = d["last"]["comm_bytes"]["dp"]["all_gather"]
    print(f"{name:<12} {d['loss']:>7.4f} {d['val_loss']:>8.4f} {d['max_d']:>11.4f} "
          f"{d['max_rel']:>8.2e} {d['last10']:>+11.2e} {gather:>12} {gather / gather0:>8.3f} "
          f"{grads(d):>10} {grads(d) / grads0:>8.3f} {d['tokens_per_s']:>9.0f} "
          f"{d['speed']:>8.3f}")
noise = {k: max(abs(runs[s][k]) for s in splits) for k in ("last10", "max_d")}
for name in quantised:
    print(f"{name}: last-10 drift {abs(runs[name]['last10']) / noise['last10']:.1f}x, largest "
          f"per-step difference {runs[name]['max_d'] / noise['max_d']:.1f}x the largest of the "
          f"micro-batch splits'")
PY
