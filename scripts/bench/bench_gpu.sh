#!/usr/bin/env bash
# GPT-2 124M (configs/gpt2-124m.toml, synthetic data) on one GPU: tokens/s and MFU of fp32 and
# bf16 training, bf16's speedup over fp32 in the same script, and the peak memory the Allocator
# counted (the kernels' own scratch and cuBLASLt/cuDNN workspaces are not in it). MFU is
# against the GPU's dense peak for the precision (core/peak_flops.h: tensor cores for
# bf16, fp32 CUDA cores for fp32).
# Steps 1-2 are warm-up (cuBLASLt heuristics, cuDNN graph builds); figures are medians of the
# remaining steps, the best of LLMT_BENCH_REPEAT runs (default 2).
#
#   scripts/bench/bench_gpu.sh LLMTRAIN_BINARY [STEPS]
# Environment: LLMT_BENCH_DEVICE (default cuda; "cpu" runs the same script on the CPU as a smoke
# test), LLMT_BENCH_MICRO (micro-batch, default 8), LLMT_BENCH_BATCH (global batch, default 16).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"

device="${LLMT_BENCH_DEVICE:-cuda}"
micro="${LLMT_BENCH_MICRO:-8}"
batch="${LLMT_BENCH_BATCH:-16}"
cp "$(dirname "${BASH_SOURCE[0]}")/../../configs/gpt2-124m.toml" "$work/bench.toml"

for ((i = 0; i < ${LLMT_BENCH_REPEAT:-2}; i++)); do
  for precision in fp32 bf16; do
    bench_run "$precision.$i" 1 --set "train.device=\"$device\"" --set "train.precision=\"$precision\"" \
      --set "train.steps=$steps" --set "train.micro_batch_size=$micro" \
      --set "train.global_batch_size=$batch" --set "train.threads=0"
  done
done

python=/usr/bin/python3  # Debian's; elsewhere (a GPU machine's image) whichever python3 is first
[[ -x "$python" ]] || python=python3
"$python" - "$work" "$(dirname "${BASH_SOURCE[0]}")" "$device" "$batch" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from runs import conditions, load
work, device, batch = sys.argv[1], sys.argv[3], int(sys.argv[4])
KEYS = ("tokens_per_s", "step_time_s", "mfu")
def peak_mem(rows):
    return {"peak_gib": max(r["peak_bytes"]["total"] for r in rows) / 2**30}
fp32, bf16 = (load(work, p, KEYS, peak_mem) for p in ("fp32", "bf16"))
print(conditions())
print(f"GPT-2 124M on {device}, {batch} x 1024 tokens per step")
print(f"{'precision':<10} {'tokens/s':>10} {'step s':>8} {'MFU':>7} {'alloc GiB':>9}")
for name, m in (("fp32", fp32), ("bf16", bf16)):
    print(f"{name:<10} {m['tokens_per_s']:>10.0f} {m['step_time_s']:>8.3f} {m['mfu']:>7.1%} "
          f"{m['peak_gib']:>9.2f}")
print(f"bf16 / fp32 tokens/s: {bf16['tokens_per_s'] / fp32['tokens_per_s']:.2f}x")
PY
