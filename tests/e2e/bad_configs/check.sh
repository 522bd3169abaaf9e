#!/usr/bin/env bash
# Runs a command that must fail in a known way: exit with EXIT and print every REGEX (grep -E,
# each on some line of stderr+stdout). On a mismatch, prints the command, its exit code and
# its output. Used by bad_configs.cmake; ctest's WILL_FAIL cannot tell exit code 2 from a crash.
# Usage: check.sh EXIT REGEX [REGEX ...] -- COMMAND [ARG ...]
set -u
expected_rc=$1
shift
regexes=()
while [[ $# -gt 0 && $1 != "--" ]]; do
  regexes+=("$1")
  shift
done
if [[ $# -lt 2 || ${#regexes[@]} -eq 0 ]]; then
  echo "usage: check.sh EXIT REGEX [REGEX ...] -- COMMAND [ARG ...]" >&2
  exit 64
fi
shift  # the "--"

output=$("$@" 2>&1)
rc=$?
ok=1
if [[ $rc -ne $expected_rc ]]; then
  echo "FAIL: exit code $rc, expected $expected_rc"
  ok=0
fi
for re in "${regexes[@]}"; do
  if ! grep -qE -- "$re" <<<"$output"; then
    echo "FAIL: output does not match: $re"
    ok=0
  fi
done
if [[ $ok -eq 0 ]]; then
  printf 'command:'
  printf ' %q' "$@"
  printf '\noutput:\n%s\n' "$output"
  exit 1
fi
echo "ok (exit $rc): $output"
