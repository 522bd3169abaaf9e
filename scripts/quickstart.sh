#!/usr/bin/env bash
# Installs the dependencies, builds llmtrain (CPU) and installs it to $LLMT_PREFIX/bin (default
# /usr/local/bin, on PATH), prepares the real-text quickstart corpus (scripts/corpus.sh: cached in
# .cache/corpus) and trains configs/quickstart.toml on it under mpirun, starting over
# (--overwrite) in runs/quickstart each time. Extra arguments go to `llmtrain train` (e.g. --set
# train.steps=50).
#
# Ranks: 2 when the machine has 2 cores or more (LLMT_RANKS overrides). The quickstart's batch of
# 16 sequences in micro-batches of 8 splits over at most 2 data-parallel ranks; on 2 cores 2 ranks
# of 1 thread ran 200 steps in 55.5 s where 1 rank of 2 threads took 64.9 s and 1 rank of 1
# thread 93.5 s (AMD EPYC, 2 cores). With more cores each rank gets half of them as threads.
#
# With no extra arguments the run must end at the final loss README.md shows (within 0.05), so
# that the README's sample line stays true; the script fails if it does not.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
llmt_install_deps
LLMT_TARGETS=llmtrain llmt_build "$LLMT_ROOT/build" -DLLMTRAIN_CUDA=OFF -DLLMTRAIN_TESTS=OFF
llmt_sudo cmake --install "$LLMT_ROOT/build" --prefix "${LLMT_PREFIX:-/usr/local}" >/dev/null
echo "==> installed $(command -v llmtrain || echo "${LLMT_PREFIX:-/usr/local}/bin/llmtrain")"
cd "$LLMT_ROOT"
# corpus.sh prints vocab_size=, data_prefix= and tokenizer=. The config points at the default
# cache; passing what was built keeps LLMT_CORPUS_DIR / LLMT_CORPUS_VOCAB overrides working.
made="$(bash scripts/corpus.sh ./build/app/llmtrain)"
declare -A corpus
while IFS='=' read -r key value; do corpus[$key]=$value; done <<< "$made"
cores="$(nproc)"
ranks="${LLMT_RANKS:-$((cores >= 2 ? 2 : 1))}"
launch=(-np "$ranks")
threads=()
if ((cores > ranks)); then  # more cores than ranks: each rank runs cores/ranks threads, unbound
  launch+=(--bind-to none)
  threads=(--set "train.threads=$((cores / ranks))")
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
llmt_mpirun "${launch[@]}" ./build/app/llmtrain train --config configs/quickstart.toml \
  --set "model.vocab_size=${corpus[vocab_size]}" --set "data.path=${corpus[data_prefix]}" \
  --set "data.tokenizer=${corpus[tokenizer]}" --overwrite "${threads[@]}" "$@" | tee "$log"

# README.md's sample line ("step 200/200 | loss X | ...") against what this run printed.
if [[ $# -eq 0 && -z "${LLMT_RANKS:-}" ]]; then
  readme="$(awk -F'|' '/^step 200\/200 \| loss / {sub(/ *loss /, "", $2); print $2 + 0; exit}' README.md)"
  got="$(awk '/^done: 200 steps, final loss / {print $6 + 0}' "$log")"
  if ! awk -v a="$readme" -v b="$got" 'BEGIN {d = a - b; exit !(a != "" && b != "" && d <= 0.05 && d >= -0.05)}'; then
    echo "quickstart: this run ended at loss ${got:-?}, README.md's sample line says ${readme:-?}" \
      "(more than 0.05 apart): README.md is out of date" >&2
    exit 1
  fi
  echo "==> final loss $got, as README.md says ($readme, within 0.05)"
fi

# What the model writes now: a short sample from the last checkpoint (llmtrain generate).
if [[ $# -eq 0 ]]; then
  echo "==> a sample: llmtrain generate --checkpoint runs/quickstart/checkpoints --prompt \"Life is\" --seed 1"
  ./build/app/llmtrain generate --checkpoint runs/quickstart/checkpoints --prompt "Life is" \
    --max-new-tokens 48 --seed 1 --top-k 50
fi
