#!/usr/bin/env bash
# Activation recompute on the GPT-2 124M shape (configs/gpt2-124m.toml) at 1 x 1024 tokens per
# step, one rank using every core: step time and peak activation bytes of recompute = "none",
# "selective" (the attention core), "selective" of the norms and the activation
# (recompute_modules = ["layernorm", "act"], "norm+act") and "full", and their ratios to "none";
# then a mixture of experts with and without its routed experts' activation recomputed, and
# latent attention with and without its up projections recomputed.
# Full recompute reruns each layer's forward in backward (expect about 4/3 of the step time);
# selective reruns only the attention core, or only the norms and GELU (no matmul).
# Steps 1-2 are warm-up; a run's figures are the median over the remaining steps, and each run is
# repeated LLMT_BENCH_REPEAT times (default 1, interleaved) keeping the fastest.
#
#   scripts/bench/bench_recompute.sh LLMTRAIN_BINARY [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}" "${2:-6}"

here="$(dirname "${BASH_SOURCE[0]}")"
cp "$here/../../configs/gpt2-124m.toml" "$work/bench.toml"
sets=(--set train.steps="$steps" --set train.global_batch_size=1 --set train.micro_batch_size=1
      --set log.progress=false)
for ((i = 0; i < ${LLMT_BENCH_REPEAT:-1}; i++)); do
  for mode in none selective full; do
    bench_run "$mode.$i" 1 "${sets[@]}" --set train.recompute="$mode"
  done
  bench_run "norm+act.$i" 1 "${sets[@]}" --set train.recompute=selective \
    --set 'train.recompute_modules=["layernorm", "act"]'
done

# The mixture of experts (configs/moe-deepseek-style.toml, bf16, micro-batches of 8 x 256) on
# one rank and at ep 2 (two ranks): the routed experts' activation ("moe_act") on top of the
# norms and the dense MLPs' and shared experts' activation.
mkdir -p "$work/moe"
moe_work="$work/moe"
cp "$here/../../configs/moe-deepseek-style.toml" "$moe_work/bench.toml"
moe_sets=(--set train.steps="$steps" --set optimizer.warmup_steps=1 --set log.progress=false
          --set train.threads=1)
for ((i = 0; i < ${LLMT_BENCH_REPEAT:-1}; i++)); do
  for ep in 1 2; do
    run() { work="$moe_work" bench_run "$1-ep$ep.$i" "$ep" "${moe_sets[@]}" \
              --set parallel.ep="$ep" --set train.global_batch_size=$((8 * ep)) "${@:2}"; }
    run none
    run norm+act --set train.recompute=selective \
      --set 'train.recompute_modules=["layernorm", "act"]'
    run norm+act+moe --set train.recompute=selective \
      --set 'train.recompute_modules=["layernorm", "act", "moe_act"]'
  done
done

# Latent attention (a DeepSeek-V3-shaped toy: 4 layers, d_model 512, 8 heads of [nope 64 | rope
# 32], values 64, query latent 192, kv latent 128; bf16, 4 x 512 tokens, one rank): the attention
# core recomputed, and with it the up projections that build its input ("mla_up_proj").
mkdir -p "$work/mla"
cat > "$work/mla/bench.toml" <<TOML
[model]
arch = "llama"
vocab_size = 4096
n_layers = 4
d_model = 512
n_heads = 8
seq_len = 512
attention = "mla"

[model.mla]
q_lora_rank = 192
kv_lora_rank = 128
qk_nope_head_dim = 64
qk_rope_head_dim = 32
v_head_dim = 64

[train]
steps = $steps
global_batch_size = 4
micro_batch_size = 4
precision = "bf16"

[optimizer]
warmup_steps = 1

[log]
progress = false
TOML
for ((i = 0; i < ${LLMT_BENCH_REPEAT:-1}; i++)); do
  work="$work/mla" bench_run "none.$i" 1
  work="$work/mla" bench_run "core.$i" 1 --set train.recompute=selective
  work="$work/mla" bench_run "core+up.$i" 1 --set train.recompute=selective \
    --set 'train.recompute_modules=["core_attn", "mla_up_proj"]'
done

/usr/bin/python3 - "$work" "$here" <<'PY'
import os
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work = sys.argv[1]
def peaks(rows):
    return {"activations": rows[-1]["peak_bytes"]["activations"]}
def table(title, folder, modes):
    runs = {m: load(folder, m, ("tokens_per_s", "step_time_s"), peaks) for m in modes}
    base = runs[modes[0]]
    print(title)
    print(f"{'recompute':<18} {'step s':>8} {'tokens/s':>9} {'time ratio':>10} "
          f"{'activations MB':>15} {'memory ratio':>12}")
    for m, r in runs.items():
        print(f"{m:<18} {r['step_time_s']:>8.2f} {r['tokens_per_s']:>9.0f} "
              f"{r['step_time_s'] / base['step_time_s']:>10.2f} {r['activations'] / 1e6:>15.1f} "
              f"{r['activations'] / base['activations']:>12.3f}")
print(conditions())
table("GPT-2 124M, 1 x 1024, fp32, one rank", work, ("none", "selective", "norm+act", "full"))
for ep in (1, 2):
    table(f"moe-deepseek-style, 8 x 256 per rank, bf16, ep {ep} (rank 0)",
          os.path.join(work, "moe"), tuple(f"{m}-ep{ep}" for m in ("none", "norm+act",
                                                                   "norm+act+moe")))
table("latent attention, 4 x 512, bf16, one rank", os.path.join(work, "mla"),
      ("none", "core", "core+up"))
PY
