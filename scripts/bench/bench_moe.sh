#!/usr/bin/env bash
# Mixture of experts on one rank using every core: tokens/s and peak activation bytes of a
# Llama-style model whose MLPs are 8 experts, top-2 (d_ff_expert 512), against the dense model of
# equal active parameters (d_ff 1024: the same FFN FLOPs per token) and against the same MoE at
# capacity factor 1.0 (dropping). 4 layers, d_model 256, seq_len 256, 8 sequences a step.
# Then the same MoE on 2 ranks bound to cores (dp 2, one thread each): experts replicated (ep 1)
# against split over the two ranks (ep 2: all-to-all dispatch, half the expert weights each).
# Then the grouped GEMM against one GEMM per expert (build/scripts/bench/bench_grouped_gemm, next
# to the binary's build folder) at the MoE MLP's shape and at a fine-grained 64-expert one.
# Steps 1-2 are warm-up; LLMT_BENCH_REPEAT (default 1) interleaved repeats, the fastest kept.
#
#   scripts/bench/bench_moe.sh LLMTRAIN_BINARY [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}" "${2:-8}"

cat > "$work/bench.toml" <<TOML
[model]
arch = "llama"
vocab_size = 4096
n_layers = 4
d_model = 256
n_heads = 8
n_kv_heads = 4
seq_len = 256
d_ff = 1024

[train]
steps = $steps
global_batch_size = 8
micro_batch_size = 8
precision = "fp32"

[optimizer]
warmup_steps = 1

[log]
progress = false
TOML
moe=(--set model.moe.num_experts=8 --set model.moe.top_k=2 --set model.moe.d_ff_expert=512)
for ((i = 0; i < ${LLMT_BENCH_REPEAT:-1}; i++)); do
  bench_run "dense.$i" 1
  bench_run "moe.$i" 1 "${moe[@]}"
  bench_run "moe_capacity.$i" 1 "${moe[@]}" --set model.moe.capacity_factor=1.0
  bench_run "dp2_ep1.$i" 2 "${moe[@]}" --set train.threads=1 --set train.micro_batch_size=4
  bench_run "dp2_ep2.$i" 2 "${moe[@]}" --set train.threads=1 --set train.micro_batch_size=4 \
    --set parallel.ep=2
done

/usr/bin/python3 - "$work" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work = sys.argv[1]
def extra(rows):
    return {"activations": rows[-1]["peak_bytes"]["activations"],
            "dropped": rows[-1].get("moe_dropped", 0.0)}
runs = {n: load(work, n, ("tokens_per_s", "step_time_s"), extra)
        for n in ("dense", "moe", "moe_capacity")}
base = runs["dense"]
print(conditions())
print(f"{'model':<14} {'step s':>7} {'tokens/s':>9} {'vs dense':>8} "
      f"{'activations MB':>15} {'dropped':>8}")
for n, r in runs.items():
    print(f"{n:<14} {r['step_time_s']:>7.3f} {r['tokens_per_s']:>9.0f} "
          f"{r['tokens_per_s'] / base['tokens_per_s']:>8.3f} "
          f"{r['activations'] / 1e6:>15.1f} {r['dropped']:>8.3f}")
def state(rows):
    p = rows[-1]["peak_bytes"]
    return {"state": p["params"] + p["grads"] + p["optimizer"], "activations": p["activations"],
            "ep_bytes": rows[-1].get("comm_bytes", {}).get("ep", {}).get("all_to_all", 0)}
two = {n: load(work, n, ("tokens_per_s", "step_time_s"), state) for n in ("dp2_ep1", "dp2_ep2")}
print(f"{'2 ranks':<14} {'step s':>7} {'tokens/s':>9} {'vs ep1':>8} {'state MB/rank':>14} "
      f"{'act MB':>7} {'a2a MB/step':>11}")
for n, r in two.items():
    print(f"{n:<14} {r['step_time_s']:>7.3f} {r['tokens_per_s']:>9.0f} "
          f"{r['tokens_per_s'] / two['dp2_ep1']['tokens_per_s']:>8.3f} {r['state'] / 1e6:>14.1f} "
          f"{r['activations'] / 1e6:>7.1f} {r['ep_bytes'] / 1e6:>11.2f}")
PY

gg="$(dirname "$llmtrain")/../scripts/bench/bench_grouped_gemm"
if [[ -x "$gg" ]]; then
  "$gg" 8 4096 256 512 7 | tail -3    # this model's MoE MLP: 2 x 2048 routed rows
  "$gg" 64 4096 512 256 7 | tail -3   # fine-grained experts
else
  echo "($gg not built: cmake --build build --target bench_grouped_gemm)"
fi
