#!/usr/bin/env bash
# Installs the dependencies, builds llmtrain (CPU), prepares the real-text quickstart corpus
# (scripts/corpus.sh: cached in .cache/corpus) and trains configs/quickstart.toml on it under
# mpirun, starting over (--overwrite) in runs/quickstart each time. Extra arguments go to
# `llmtrain train` (e.g. --set train.steps=50).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
llmt_install_deps
LLMT_TARGETS=llmtrain llmt_build "$LLMT_ROOT/build" -DLLMTRAIN_CUDA=OFF -DLLMTRAIN_TESTS=OFF
cd "$LLMT_ROOT"
# corpus.sh prints vocab_size=, data_prefix= and tokenizer=. The config points at the default
# cache; passing what was built keeps LLMT_CORPUS_DIR / LLMT_CORPUS_VOCAB overrides working.
made="$(bash scripts/corpus.sh ./build/app/llmtrain)"
declare -A corpus
while IFS='=' read -r key value; do corpus[$key]=$value; done <<< "$made"
llmt_mpirun -np "${LLMT_RANKS:-1}" ./build/app/llmtrain train --config configs/quickstart.toml \
  --set "model.vocab_size=${corpus[vocab_size]}" --set "data.path=${corpus[data_prefix]}" \
  --set "data.tokenizer=${corpus[tokenizer]}" --overwrite "$@"
