#!/usr/bin/env bash
# [offload] "nvme" beyond the machine's memory: a GPT-2-shaped model of 2.6B parameters (d_model
# 2560, 32 layers, vocab 32000; training state 16 bytes a parameter, 41.6 GB in fp32) trained for
# STEPS steps on one rank with ZeRO-3 and offload.optimizer = offload.params = "nvme" (its
# parameter shards and AdamW's m and v in files under NVME_DIR; the gradient shards, 10.4 GB,
# stay in memory). Prints the machine (CPU, cores, memory), the disk's sequential bandwidth
# measured by dd in the same folder (2 GiB, O_DIRECT, 16 MiB blocks, write then read), and per
# step the time, tokens/s, the bytes the process moved to and from disk over the step's time
# (disk_io_bytes) against dd's, the peak resident set against the training state and the
# machine's memory, and what was in the files. Not a CI test: it writes about 100 GB per step.
#
#   scripts/bench/bench_offload.sh LLMTRAIN_BINARY [STEPS] [NVME_DIR]   (default 3, $TMPDIR or /tmp)
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 LLMTRAIN_BINARY [STEPS] [NVME_DIR]" >&2
  exit 2
fi
llmtrain="$(realpath "$1")"
steps="${2:-3}"
nvme="$(realpath "${3:-${TMPDIR:-/tmp}}")"
work="$(mktemp -d "$nvme/llmtrain-bench-offload-XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), cpu family" \
  "$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model" \
  "$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
  "$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) memory;" \
  "disk free in $nvme: $(df -h --output=avail "$nvme" | tail -1 | xargs)"
dd_rate() {  # bytes/s of the dd run whose output is on stdin
  tail -1 | sed -E 's/^([0-9]+) bytes.* copied, ([0-9.]+) s.*/\1 \2/' | awk '{printf "%.0f", $1 / $2}'
}
write_bw="$(dd if=/dev/zero of="$work/dd" bs=16M count=128 oflag=direct 2>&1 | dd_rate)"
read_bw="$(dd if="$work/dd" of=/dev/null bs=16M iflag=direct 2>&1 | dd_rate)"
rm -f "$work/dd"
echo "dd in $nvme: write $write_bw B/s, read $read_bw B/s"

mkdir "$work/nvme"
cat > "$work/offload.toml" <<TOML
[model]
arch = "gpt2"
vocab_size = 32000
n_layers = 32
d_model = 2560
n_heads = 32
seq_len = 256

[train]
steps = $steps
global_batch_size = 1
micro_batch_size = 1
precision = "fp32"
threads = $(nproc)
run_dir = "$work/run"

[optimizer]
warmup_steps = 1

[parallel]
zero_stage = 3

[offload]
optimizer = "nvme"
params = "nvme"
nvme_dir = "$work/nvme"
buffer_mb = 64

[checkpoint]
interval = 0

[log]
progress = false
TOML
"$llmtrain" plan --config "$work/offload.toml" | grep -E "^parameters|rank 0 \(tp|offloaded"
start="$(date +%s.%N)"
"$llmtrain" train --config "$work/offload.toml" -q
echo "wall clock $(echo "$(date +%s.%N) - $start" | bc) s, $steps steps; nvme_dir now holds" \
  "$(find "$work/nvme" -mindepth 1 | wc -l) entries"
/usr/bin/python3 - "$work/run/metrics.jsonl" "$write_bw" "$read_bw" <<'PY'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
write_bw, read_bw = float(sys.argv[2]), float(sys.argv[3])
mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal"))
prev = 0
for r in rows:
    io = r["disk_io_bytes"] - prev
    prev = r["disk_io_bytes"]
    rate = io / r["step_time_s"]
    print(f"step {r['step']}: loss {r['loss']:.4f}, {r['step_time_s']:.1f} s, "
          f"{r['tokens_per_s']:.1f} tokens/s, disk {io / 1e9:.1f} GB at {rate / 1e9:.2f} GB/s "
          f"({rate / read_bw:.2f}x dd's read, {rate / write_bw:.2f}x its write), resident peak "
          f"{r['rss_peak_bytes'] / 2**30:.2f} GiB of {mem / 2**30:.1f} GiB, in files "
          f"{ {k: round(v / 2**30, 2) for k, v in r['offload_bytes'].items()} } GiB, device "
          f"bytes {r['peak_bytes']['total'] / 2**30:.2f} GiB")
PY
