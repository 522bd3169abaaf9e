# Shared by the multi-rank benchmarks (bench_dp.sh, bench_tp.sh): their arguments
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

# bench_run NAME RANKS --set...: trains $work/bench.toml into $work/NAME (metrics.jsonl), one
# rank without mpirun or RANKS ranks bound to cores; CPU seconds (user + sys of all ranks, through
# mpirun's waited-for children) go to $work/NAME.cpu.
bench_run() {
  local name="$1" ranks="$2"
  shift 2
  local cmd=("$llmtrain" train --config "$work/bench.toml" -q --set "train.run_dir=$work/$name" "$@")
  local timer=(/usr/bin/time -f "%U %S" -o "$work/$name.cpu")
  if [[ "$ranks" -gt 1 ]]; then
    "${timer[@]}" mpirun --oversubscribe --bind-to core -np "$ranks" "${cmd[@]}"
  else
    "${timer[@]}" "${cmd[@]}"
  fi
}
