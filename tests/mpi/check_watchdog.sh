#!/usr/bin/env bash
# The watchdog's verdict names the ranks that did not reach the collective (watchdog_case.cpp):
# usage: check_watchdog.sh MPIRUN WATCHDOG_CASE
set -uo pipefail
mpirun="$1" prog="$2"
start=$SECONDS
out="$(timeout 60 "$mpirun" --oversubscribe -np 4 "$prog" 2>&1)"
rc=$?
took=$((SECONDS - start))
fail() { echo "FAIL: $1"; echo "--- output (exit $rc, ${took} s):"; echo "$out"; exit 1; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "the job should end by the watchdog's abort"
echo "$out" | grep -q "the stuck collective completed" && fail "a stuck collective completed"
verdict="$(echo "$out" | grep -E "^error: rank [02]: all_reduce #3 on world \(4 ranks\) did not complete within 1 s" | head -1)"
[ -n "$verdict" ] || fail "no verdict from rank 0 or 2 on the world's all_reduce #3"
r="$(echo "$verdict" | sed -E 's/^error: rank ([02]).*/\1/')"
other=$((2 - r))
# The lines after the verdict's first line, up to its last.
block="$(echo "$out" | sed -n "/^error: rank $r: all_reduce #3/,/aborting the job/p")"
echo "$block" | grep -q "^  rank 1: did not answer: it is outside every collective" || fail "rank 1 is not named as not answering"
echo "$block" | grep -q "^  rank 3: has not reached it (started 2 collectives on world); waits in all_reduce #1 on pair (2 ranks)" || fail "rank 3 is not named as waiting in pair"
echo "$block" | grep -qE "^  rank $other: reached it; waits in all_reduce #3 on world \(4 ranks\)" || fail "rank $other is not named as having reached it"
echo "$block" | grep -q "ranks that did not reach it: 1, 3; aborting the job" || fail "the summary does not name ranks 1 and 3"
echo "watchdog verdict (rank $r, job ended after ${took} s, exit $rc):"
echo "$block"
