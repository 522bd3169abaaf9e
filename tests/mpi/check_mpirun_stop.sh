#!/usr/bin/env bash
# A stop request under mpirun (docs/slurm.md, "Stopping early"): SIGTERM to
# scripts/mpirun_graceful.sh while rank 0 waits inside step 5 (LLMTRAIN_FAULT=forward:5:0:WAIT,
# until a stop signal reaches it) must end with exit 75 and a checkpoint of step 5, as under
# srun. The same SIGTERM sent to mpirun itself is printed for comparison: Open MPI 4.1 exits 1
# (here the tiny model's step ends within the second before its SIGKILL; a longer one is lost).
#   check_mpirun_stop.sh LLMTRAIN CONFIG WORKDIR
set -u
llmtrain="$1" config="$2" work="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$work" && mkdir -p "$work"
run() {  # run NAME LAUNCHER...: starts it in the background; its pid in $pid
  local name="$1"
  shift
  LLMTRAIN_FAULT=forward:5:0:WAIT "$@" -np 2 -x LLMTRAIN_FAULT "$llmtrain" --config "$config" -q \
    --set train.steps=1000 --set train.run_dir=\""$work/$name"\" \
    --set checkpoint.dir=\""$work/$name/ck"\" --set checkpoint.interval=0 > "$work/$name.log" 2>&1 &
  pid=$!
}
wait_step4() {  # until step 4's metrics line: rank 0 is then inside step 5, waiting
  for _ in $(seq 600); do
    grep -q '"step": 4,' "$work/$1/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
fail=0
run graceful "$root/scripts/mpirun_graceful.sh"
wait_step4 graceful || { echo "FAIL: the run did not reach step 4"; cat "$work/graceful.log"; exit 1; }
kill -TERM "$pid"
wait "$pid"
rc=$?
echo "SIGTERM to mpirun_graceful.sh: exit $rc; $(grep '^stopped' "$work/graceful.log")"
[[ $rc -eq 75 && -d "$work/graceful/ck/step_00000005" ]] ||
  { echo "FAIL: expected exit 75 and a checkpoint of step 5"; cat "$work/graceful.log"; fail=1; }
run plain mpirun
wait_step4 plain || { echo "FAIL: the run did not reach step 4"; exit 1; }
kill -TERM "$pid"
wait "$pid"
echo "SIGTERM to mpirun itself: exit $?; checkpoints: $(ls "$work/plain/ck" 2>/dev/null | tr '\n' ' ')"
[[ $fail -eq 0 ]] && echo "mpirun stop: checks passed"
exit $fail
