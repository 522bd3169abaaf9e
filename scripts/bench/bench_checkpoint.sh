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
steps = 20
global_batch_size = 2
micro_batch_size = 1
precision = "fp32"
threads = 1

[optimizer]
warmup_steps = 1
TOML

run() {  # NAME RANKS INTERVAL STOP ARGS...: save every INTERVAL steps up to STOP, then resume
  local name=$1 ranks=$2 interval=$3 stop=$4
  shift 4
  local launch=()
  [[ $ranks -gt 1 ]] && launch=(mpirun --oversubscribe -np "$ranks")
  rm -rf "$work/$name"
  "${launch[@]}" "$llmtrain" train --config "$work/bench.toml" --stop-after-steps "$stop" \
    --set train.run_dir="$work/$name" --set checkpoint.dir="$work/$name/ckpt" \
    --set checkpoint.interval="$interval" --set log.progress=false "$@" > "$work/$name.save.log"
  "${launch[@]}" "$llmtrain" train --config "$work/bench.toml" --stop-after-steps $((stop + 1)) \
    --set train.run_dir="$work/$name" --set checkpoint.dir="$work/$name/ckpt" \
    --set checkpoint.load=latest --set log.progress=false "$@" > "$work/$name.load.log"
  grep -h "checkpoint: saved\|checkpoint: resumed" "$work/$name.save.log" "$work/$name.load.log" \
    | sed "s/^/$name: /"
  /usr/bin/python3 - "$work/$name/metrics.jsonl" "$name" "$interval" "$stop" <<'PY'
import json, sys
interval, stop = int(sys.argv[3]), int(sys.argv[4])
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["step"] <= stop]  # the first run
step = [r["step_time_s"] for r in rows]
at_save = [r["checkpoint_s"] for r in rows if r["step"] % interval == 0 and "checkpoint_s" in r]
polls = [r["checkpoint_s"] for r in rows if r["step"] % interval and "checkpoint_s" in r]
print(f"{sys.argv[2]}: step time {min(step):.2f} s without checkpoint work; training blocked "
      f"{', '.join(f'{b:.2f}' for b in at_save)} s at the save steps"
      + (f", {max(polls) * 1e3:.1f} ms at most per poll on the other steps" if polls else ""))
PY
}

echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}, $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg), work dir on $(df --output=source "$work" | tail -1)"
for ((i = 0; i < repeats; i++)); do
  # Synchronous: a save after every step. Async: every 6 steps, so that a save's write (a few
  # seconds here) finishes before the next one starts; blocked = the host copy.
  run rank1.$i 1 1 2
  run dp2_zero1.$i 2 1 2 --set parallel.zero_stage=1
  run rank1_async.$i 1 6 12 --set checkpoint.async=true
  run dp2_zero1_async.$i 2 6 12 --set parallel.zero_stage=1 --set checkpoint.async=true
done
