#!/usr/bin/env bash
# Tokenization throughput of `llmtrain data prepare` against SentencePiece's own command line,
# `spm_encode --output_format=id`, on the same corpus and model. spm_encode is single-threaded, so
# prepare runs with --threads 1 (same thread count) and with --threads 2 (both cores). Both encode
# line by line (prepare --line-docs), so they produce the same token count, which is checked.
# Best of 3 runs each; prepare's time includes writing and syncing the .bin/.idx.
#
#   scripts/bench/bench_prepare.sh LLMTRAIN_BINARY [TEXT_FILE TOKENIZER_MODEL]
#
# Without TEXT_FILE and TOKENIZER_MODEL: the quickstart corpus (scripts/corpus.sh). The text is
# repeated LLMT_BENCH_REPEAT times (default 8, ~20 MB for the corpus) so runs last seconds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -ne 1 && $# -ne 3 ]]; then
  echo "usage: $0 LLMTRAIN_BINARY [TEXT_FILE TOKENIZER_MODEL]" >&2
  exit 2
fi
llmtrain="$1"
if [[ $# -eq 3 ]]; then
  text="$2" model="$3"
else
  out="$(bash "$here/../corpus.sh" "$llmtrain")"
  model="$(sed -n 's/^tokenizer=//p' <<<"$out")"
  text="$(dirname "$model")/fortunes.txt"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for ((i = 0; i < ${LLMT_BENCH_REPEAT:-8}; i++)); do cat "$text"; done > "$work/corpus.txt"
mb=$(awk -v b="$(stat -c %s "$work/corpus.txt")" 'BEGIN{printf "%.1f", b / 1e6}')

now() { date +%s.%N; }
# best_of CMD...: runs CMD 3 times (stdout to $work/out), prints the shortest wall time in seconds.
best_of() {
  local best="" t0 t1
  for _ in 1 2 3; do
    t0=$(now)
    "$@" > "$work/out"
    t1=$(now)
    best=$(awk -v a="$t0" -v b="$t1" -v best="$best" 'BEGIN{t = b - a; print (best == "" || t < best) ? t : best}')
  done
  echo "$best"
}

spm_time=$(best_of spm_encode --model "$model" --output_format=id --input "$work/corpus.txt")
spm_tokens=$(wc -w < "$work/out")
declare -A t n
for threads in 1 2; do
  t[$threads]=$(best_of "$llmtrain" data prepare --input "$work/corpus.txt" --tokenizer "$model" \
    --output "$work/ds" --line-docs --threads "$threads")
  n[$threads]=$(sed -n 's/.* documents .*), \([0-9]*\) tokens .*/\1/p' "$work/out")
  if [[ ${n[$threads]} != "$spm_tokens" ]]; then
    echo "token counts differ: spm_encode $spm_tokens, prepare ${n[$threads]}" >&2
    exit 1
  fi
done

echo "corpus: $mb MB ($text x ${LLMT_BENCH_REPEAT:-8}), model $model, $spm_tokens tokens, $(nproc) cores"
awk -v tok="$spm_tokens" -v s="$spm_time" -v p1="${t[1]}" -v p2="${t[2]}" 'BEGIN {
  printf "spm_encode --output_format=id (1 thread):  %10.0f tokens/s  (%.2f s)\n", tok / s, s
  printf "llmtrain data prepare --threads 1:         %10.0f tokens/s  (%.2f s)  ratio %.2fx\n", tok / p1, p1, s / p1
  printf "llmtrain data prepare --threads 2:         %10.0f tokens/s  (%.2f s)  ratio %.2fx\n", tok / p2, p2, s / p2
}'
