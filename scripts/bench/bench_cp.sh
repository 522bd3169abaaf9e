#!/usr/bin/env bash
# Context parallelism with multi-head latent attention on one machine: tokens/s and the cp bytes
# per step of cp=2 (two ranks under mpirun, one OpenMP thread each) with the ring moving each
# position's kv latent and RoPE key (parallel.cp_latent = true, the default), with the ring
# moving the expanded K/V (cp_latent = false), and with Ulysses all-gathering the latent (the
# default) or moving the K/V through its all-to-all (cp_latent = false), against cp=1 (one rank,
# one thread) on the same global batch. The latent ring moves (kv_lora_rank + qk_rope_head_dim) /
# (2 H D) of the K/V ring's bytes and runs kv_b on the other rank's blocks four more times a
# layer (forward; backward: expand, input and weight gradients); latent Ulysses runs it twice
# more (its heads at every position, forward and backward). On one machine the hops are memory
# copies, so this measures what the expansions cost; what the bytes save depends on the link
# (docs/parallelism.md, "The ring of latent attention", "Ulysses over the latent").
# Steps 1-2 are warm-up; a run's figures are the median over the remaining steps, and each run
# is repeated LLMT_BENCH_REPEAT times (default 2, interleaved) keeping the fastest.
#
#   scripts/bench/bench_cp.sh LLMTRAIN_BINARY [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

# 4 layers, d_model 256, 8 heads, 8 x 1024 tokens per step; MLA at DeepSeek-V3's proportions
# scaled down: kv latent 64, query latent 96, heads of [nope 32 | rope 16], values of 32.
bench_config 2048 256 8 1024 8
mla=(--set model.arch=llama --set model.attention=mla --set train.micro_batch_size=2
     --set model.mla.q_lora_rank=96 --set model.mla.kv_lora_rank=64
     --set model.mla.qk_nope_head_dim=32 --set model.mla.qk_rope_head_dim=16
     --set model.mla.v_head_dim=32)

for ((i = 0; i < ${LLMT_BENCH_REPEAT:-2}; i++)); do
  bench_run cp1.$i 1 "${mla[@]}"
  bench_run latent.$i 2 "${mla[@]}" --set parallel.cp=2
  bench_run kv.$i 2 "${mla[@]}" --set parallel.cp=2 --set parallel.cp_latent=false
  bench_run ulysses.$i 2 "${mla[@]}" --set parallel.cp=2 --set parallel.cp_impl=ulysses
  bench_run ulysses_kv.$i 2 "${mla[@]}" --set parallel.cp=2 --set parallel.cp_impl=ulysses \
    --set parallel.cp_latent=false
done

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work = sys.argv[1]
KEYS = ("tokens_per_s", "step_time_s")
def cp_extra(rows):  # this step's cp traffic (the gradient all-reduce apart)
    cp = rows[-1].get("comm_bytes", {}).get("cp", {})
    return {"cp_bytes": sum(cp.get(k, 0) for k in ("send", "all_to_all", "all_gather",
                                                   "reduce_scatter"))}
base = load(work, "cp1", KEYS, cp_extra)
print(conditions())
print(f"{'run':<28} {'tokens/s':>10} {'step s':>8} {'speedup':>8} {'cp MB/step':>10}")
for name, label in [("cp1", "cp=1 (1 thread)"), ("latent", "cp=2 ring of the latent"),
                    ("kv", "cp=2 ring of K/V"), ("ulysses", "cp=2 Ulysses of the latent"),
                    ("ulysses_kv", "cp=2 Ulysses of K/V")]:
    m = load(work, name, KEYS, cp_extra)
    print(f"{label:<28} {m['tokens_per_s']:>10.0f} {m['step_time_s']:>8.3f} "
          f"{m['tokens_per_s'] / base['tokens_per_s']:>8.2f} {m['cp_bytes'] / 1e6:>10.2f}")
PY
