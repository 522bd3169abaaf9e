#!/usr/bin/env bash
# `checkpoint export` finds a run's tokenizer given by a relative data.tokenizer (relative to the
# directory the run started in, where export runs too) and writes it beside the weights.
#   check_export_relative_tokenizer.sh LLMTRAIN CORPUS_TEXT WORKDIR
set -euo pipefail
llmtrain="$1" text="$2" work="$3"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$llmtrain" data tokenizer-train --input "$text" --vocab-size 600 --output tok.model > /dev/null
"$llmtrain" data prepare --input "$text" --tokenizer tok.model --output ds > /dev/null
"$llmtrain" train --config /dev/stdin -q --set model.vocab_size=600 --set 'data.path="ds"' \
  --set 'data.tokenizer="tok.model"' > /dev/null <<'TOML'
[model]
arch = "llama"
n_layers = 1
d_model = 32
n_heads = 2
seq_len = 16
[train]
steps = 1
global_batch_size = 2
run_dir = "run"
[optimizer]
warmup_steps = 1
[data]
source = "indexed"
[checkpoint]
dir = "run/ck"
TOML
"$llmtrain" checkpoint export run/ck hf 2>&1
test -f hf/tokenizer.model && echo "exported the tokenizer: hf/tokenizer.model"
