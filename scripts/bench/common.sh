# Shared by the multi-rank benchmarks (bench_dp.sh, bench_tp.sh, bench_pp.sh,
# bench_checkpoint.sh): their arguments
# (LLMTRAIN_BINARY [STEPS]), a scratch folder $work removed on exit, and bench_run.
# Sourced with the script's arguments: source common.sh "$@"

if [[ $# -lt 1 ]]; then
  echo "usage: $0 LLMTRAIN_BINARY [STEPS]" >&2
  exit 2
fi
llmtrain="$(realpath "$1")"
steps="${2:-12}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# bench_config VOCAB D_MODEL N_HEADS SEQ_LEN GLOBAL_BATCH: writes $work/bench.toml, a 4-layer GPT-2
# shape trained for $steps steps in fp32 with micro-batches of 4 and one thread per rank.
bench_config() {
  cat > "$work/bench.toml" <<TOML
[model]
arch = "gpt2"
vocab_size = $1
n_layers = 4
d_model = $2
n_heads = $3
seq_len = $4

[train]
steps = $steps
global_batch_size = $5
micro_batch_size = 4
precision = "fp32"
threads = 1

[optimizer]
warmup_steps = 1

[log]
progress = false
TOML
}

# bench_run NAME RANKS --set...: trains $work/bench.toml into $work/NAME (metrics.jsonl), one
# rank without mpirun or RANKS ranks bound to cores; CPU seconds (user + sys of all ranks, through
# mpirun's waited-for children) go to $work/NAME.cpu.
bench_run() {
  local name="$1" ranks="$2"
  shift 2
  local cmd=("$llmtrain" train --config "$work/bench.toml" -q --set "train.run_dir=$work/$name" "$@")
  local timer=(/usr/bin/time -f "%U %S" -o "$work/$name.cpu")
  if [[ ! -x /usr/bin/time ]]; then  # GNU time is missing (a GPU machine's image): no CPU seconds
    echo "0 0" > "$work/$name.cpu"
    timer=()
  fi
  if [[ "$ranks" -gt 1 ]]; then
    "${timer[@]}" mpirun --oversubscribe --bind-to core -np "$ranks" "${cmd[@]}"
  else
    "${timer[@]}" "${cmd[@]}"
  fi
}

# quickstart_bench: $work/bench.toml = configs/quickstart.toml, and $prefix / $tokenizer the
# fortunes corpus scripts/corpus.sh prepares (bench_muon.sh, bench_fp8.sh).
quickstart_bench() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  local corpus
  mapfile -t corpus < <("$root/scripts/corpus.sh" "$llmtrain")
  prefix="${corpus[1]#data_prefix=}"
  tokenizer="${corpus[2]#tokenizer=}"
  cp "$root/configs/quickstart.toml" "$work/bench.toml"
}
