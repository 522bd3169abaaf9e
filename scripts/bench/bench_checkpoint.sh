#!/usr/bin/env bash
# Checkpoint save and load throughput on the GPT-2 124M shape (fp32: master weights + Adam m and
# v = 1.49 GB per checkpoint), on 1 rank and on 2 ranks (dp=2, each rank writing half; ZeRO-1,
# each rank loading its optimizer shard), synchronous and with checkpoint.async, and the time
# training is blocked per save. A synchronous save blocks until every rank file is written and
# fsynced and the index and `latest` are in place; an async one only for the host copy (and
# for a previous save still in flight). Figures are from the runs' own log lines.
#
#   scripts/bench/bench_checkpoint.sh LLMTRAIN_BINARY [REPEATS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
repeats="${2:-2}"

cat > "$work/bench.toml" <<TOML
[model]
arch = "gpt2"
vocab_size = 50304
n_layers = 12
d_model = 768
n_heads = 12
seq_len = 64

[train]
steps = 4
global_batch_size = 2
micro_batch_size = 1
precision = "fp32"
threads = 1

[optimizer]
warmup_steps = 1
TOML

run() {  # NAME RANKS ARGS...: save after steps 1 and 2, then resume and run step 3
  local name=$1 ranks=$2
  shift 2
  local launch=()
  [[ $ranks -gt 1 ]] && launch=(mpirun --oversubscribe -np "$ranks")
  rm -rf "$work/$name"
  "${launch[@]}" "$llmtrain" train --config "$work/bench.toml" --stop-after-steps 2 \
    --set train.run_dir="$work/$name" --set checkpoint.dir="$work/$name/ckpt" \
    --set checkpoint.interval=1 --set log.progress=false "$@" > "$work/$name.save.log"
  "${launch[@]}" "$llmtrain" train --config "$work/bench.toml" --stop-after-steps 3 \
    --set train.run_dir="$work/$name" --set checkpoint.dir="$work/$name/ckpt" \
    --set checkpoint.load=latest --set log.progress=false "$@" > "$work/$name.load.log"
  grep -h "checkpoint: saved\|checkpoint: resumed" "$work/$name.save.log" "$work/$name.load.log" \
    | sed "s/^/$name: /"
  /usr/bin/python3 - "$work/$name/metrics.jsonl" "$name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
step = [r["step_time_s"] for r in rows]
blocked = [r["checkpoint_s"] for r in rows if "checkpoint_s" in r]
print(f"{sys.argv[2]}: step time {min(step):.2f} s without the save; training blocked "
      f"{', '.join(f'{b:.2f}' for b in blocked)} s per save")
PY
}

echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}, $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg), work dir on $(df --output=source "$work" | tail -1)"
for ((i = 0; i < repeats; i++)); do
  run rank1.$i 1
  run dp2_zero1.$i 2 --set parallel.zero_stage=1
  run rank1_async.$i 1 --set checkpoint.async=true
  run dp2_zero1_async.$i 2 --set parallel.zero_stage=1 --set checkpoint.async=true
done
