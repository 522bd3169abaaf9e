#!/usr/bin/env bash
# mpirun whose SIGTERM stops llmtrain cleanly (a checkpoint of the current step, exit 75), as
# srun's does. Open MPI's mpirun treats SIGTERM as an abort: it kills the ranks about a second
# later (odls_base_sigkill_timeout), so a step longer than that is lost, and it exits 1 whatever
# the ranks did; SIGUSR1 it forwards to every rank unchanged. This wrapper turns a SIGTERM (or
# SIGUSR1) it receives into SIGUSR1 to mpirun and exits with mpirun's status (docs/slurm.md).
#
#   scripts/mpirun_graceful.sh -np 8 llmtrain --config run.toml --set checkpoint.load=auto
set -u
mpirun "$@" &
pid=$!
trap 'kill -USR1 "$pid" 2>/dev/null' TERM USR1
while :; do
  wait "$pid"
  rc=$?
  kill -0 "$pid" 2>/dev/null || exit "$rc"  # a trapped signal interrupted wait: wait again
done
