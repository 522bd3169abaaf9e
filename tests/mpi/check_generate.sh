#!/usr/bin/env bash
# `llmtrain generate` on a model trained for a few steps on a text (a tokenizer trained on it):
# greedy decoding gives the same tokens on one rank and over tp 2 and tp 4 (mpirun; the KV-cache
# logits against the whole-sequence forward are test_model's KvCacheDecodingEqualsTheWhole...);
# the same seed samples the same text; a model vocabulary padded past the tokenizer's never
# yields a padding id; a prompt that fills model.seq_len and a checkpoint whose
# run had no tokenizer are refused (exit 2, saying why); a latent-attention model decodes on one
# rank and is refused under mpirun.
#   check_generate.sh LLMTRAIN MPIRUN TEXT WORKDIR
set -euo pipefail
llmtrain="$1" mpirun="$2" text="$3" work="$4"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$llmtrain" data tokenizer-train --input "$text" --vocab-size 512 --output tok.model > /dev/null
"$llmtrain" data prepare --input "$text" --tokenizer tok.model --output ds > /dev/null
"$llmtrain" train --config /dev/stdin -q --set 'data.path="ds"' \
  --set 'data.tokenizer="tok.model"' > /dev/null <<'TOML'
[model]
arch = "llama"
vocab_size = 512
n_layers = 2
d_model = 64
n_heads = 4
n_kv_heads = 4
seq_len = 32
[train]
steps = 100
global_batch_size = 8
threads = 1
run_dir = "run"
[optimizer]
lr = 1e-2
warmup_steps = 2
[data]
source = "indexed"
split = "100,0,0"
[checkpoint]
dir = "run/ck"
TOML
ids() { sed -n 's/^token ids: //p'; }
# refused WHAT WANT CMD...: CMD must fail (exit 2, or any failure under mpirun: its own code)
# with a message holding WANT.
refused() {
  local what="$1" want="$2" msg rc
  shift 2
  set +e
  msg="$("$@" 2>&1)"
  rc=$?
  set -e
  echo "$what: exit $rc: ${msg##*error: }"
  if [[ "$1" == "$mpirun" ]]; then [[ $rc -ne 0 ]]; else [[ $rc -eq 2 ]]; fi &&
    [[ "$msg" == *"$want"* ]] || { echo "FAIL: $what"; fail=1; }
}
gen=(generate --checkpoint run/ck --prompt "The model" --max-new-tokens 12 --ignore-eos)
fail=0
one="$("$llmtrain" "${gen[@]}" --temperature 0 2>&1 | ids)"
echo "tp1 greedy: $one"
[[ $(wc -w <<< "$one") -eq 12 ]] || { echo "FAIL: not 12 tokens"; fail=1; }
for n in 2 4; do
  # (The ids are on stderr, the text on stdout, kept apart: mpirun forwards the two streams as
  # they come, and a loaded machine once put a piece of the text inside the ids' line.)
  got="$("$mpirun" --oversubscribe -np $n "$llmtrain" "${gen[@]}" --temperature 0 2>&1 \
    > "tp$n.out" | ids)"
  echo "tp$n greedy: $got"
  [[ "$got" == "$one" ]] || { echo "FAIL: greedy at tp$n differs from one rank"; fail=1; }
done
a="$("$llmtrain" "${gen[@]}" --seed 5 --top-k 40 --top-p 0.9 2>&1 | ids)"
b="$("$llmtrain" "${gen[@]}" --seed 5 --top-k 40 --top-p 0.9 2>&1 | ids)"
echo "sampled (seed 5): $a"
[[ -n "$a" && "$a" == "$b" ]] || { echo "FAIL: the same seed sampled other tokens"; fail=1; }
# A vocabulary padded past the tokenizer's 512 pieces: the padding ids are never drawn.
"$llmtrain" train --config run/config.toml -q --set model.vocab_size=576 --set train.steps=5 \
  --set 'data.path="ds"' --set 'data.tokenizer="tok.model"' --set train.run_dir=\"padded\" \
  --set checkpoint.dir=\"padded/ck\" > /dev/null
pad="$("$llmtrain" generate --checkpoint padded/ck --prompt "The model" --max-new-tokens 24 \
  --ignore-eos --seed 3 --temperature 2 2>&1 | ids)"
echo "padded vocabulary, temperature 2: $pad"
for id in $pad; do
  [[ $id -lt 512 ]] || { echo "FAIL: drew id $id, past the tokenizer's 512 pieces"; fail=1; }
done
[[ $(wc -w <<< "$pad") -eq 24 ]] || { echo "FAIL: not 24 tokens"; fail=1; }
long="$(printf 'word %.0s' {1..40})"
refused "long prompt" "leaves no room to generate" \
  "$llmtrain" generate --checkpoint run/ck --prompt "$long"
refused "no tokenizer" "--tokenizer" \
  "$llmtrain" generate --checkpoint run/ck --set 'data.tokenizer=""' --prompt x
# Latent attention decodes on one rank (its KV-cache logits: test_model's
# KvCacheDecodingEqualsTheWholeSequenceForward); under mpirun it is refused saying why.
"$llmtrain" train --config run/config.toml -q --set model.attention=mla --set model.n_kv_heads=0 \
  --set model.mla.kv_lora_rank=16 --set model.mla.qk_nope_head_dim=8 \
  --set model.mla.qk_rope_head_dim=8 --set model.mla.v_head_dim=8 --set train.steps=5 \
  --set 'data.path="ds"' --set 'data.tokenizer="tok.model"' --set train.run_dir=\"mla\" \
  --set checkpoint.dir=\"mla/ck\" > /dev/null
mla="$("$llmtrain" generate --checkpoint mla/ck --prompt "The model" --max-new-tokens 8 \
  --ignore-eos --temperature 0 2>&1 | ids)"
echo "latent attention, one rank: $mla"
[[ $(wc -w <<< "$mla") -eq 8 ]] || { echo "FAIL: latent attention: not 8 tokens"; fail=1; }
refused "latent attention at 2 ranks" "decodes on one rank" \
  "$mpirun" --oversubscribe -np 2 "$llmtrain" generate --checkpoint mla/ck --prompt x
[[ $fail -eq 0 ]] && echo "generate: checks passed"
exit $fail
