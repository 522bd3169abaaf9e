#!/usr/bin/env bash
# The quickstart corpus, offline: English quotes and short texts from Debian's `fortunes` package
# (~2.5 MB, '%'-separated) become one document per fortune in a blank-line-separated text file,
# then a BPE tokenizer is trained on it and the text prepared into a Megatron indexed dataset.
# Every step is skipped when its output exists (cache: $LLMT_CORPUS_DIR, default .cache/corpus).
#
#   scripts/corpus.sh LLMTRAIN_BINARY
#
# Progress goes to stderr; stdout is three lines, the last two being the dataset prefix and the
# tokenizer path:  vocab_size=2048 / data_prefix=/abs/path/fortunes-bpe2048 / tokenizer=/abs/...
# Env: LLMT_CORPUS_DIR, LLMT_CORPUS_VOCAB (default 2048).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ $# -ne 1 || ! -x $1 ]]; then
  echo "usage: $0 LLMTRAIN_BINARY (an executable llmtrain)" >&2
  exit 2
fi
llmtrain="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
dir="${LLMT_CORPUS_DIR:-$LLMT_ROOT/.cache/corpus}"
vocab="${LLMT_CORPUS_VOCAB:-2048}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
fortunes=/usr/share/games/fortunes
text="$dir/fortunes.txt"
name="fortunes-bpe$vocab"

if [[ ! -d $fortunes ]]; then
  echo "==> installing the fortunes package" >&2
  llmt_install_deps >&2
fi

if [[ ! -s $text ]]; then
  echo "==> $text: one document per fortune from $fortunes" >&2
  # Each fortune file minus the index (.dat), the .u8 links and the ASCII drawings. Overstrike
  # ("_\bA") is reduced to the letter; blank lines inside a fortune are dropped, so blank lines
  # only separate documents.
  for f in "$fortunes"/*; do
    case "$f" in *.dat | *.u8 | */ascii-art) continue ;; esac
    [[ -f $f && ! -L $f ]] || continue
    sed 's/.\x08//g' "$f"
    echo %
  done | awk '
    function flush() { if (n > 0) printf "%s\n\n", doc; doc = ""; n = 0 }
    /^%$/ { flush(); next }
    /^[ \t\r]*$/ { next }
    { doc = n++ ? doc "\n" $0 : $0 }
    END { flush() }' > "$text.tmp"
  mv "$text.tmp" "$text"
fi

if [[ ! -s $dir/$name.model ]]; then
  echo "==> $dir/$name.model: BPE tokenizer, vocab $vocab" >&2
  "$llmtrain" data tokenizer-train --input "$text" --vocab-size "$vocab" --model-type bpe \
    --output "$dir/$name.model" >&2
fi

if [[ ! -s $dir/$name.idx || ! -s $dir/$name.bin ]]; then
  echo "==> $dir/$name.{bin,idx}: the prepared dataset" >&2
  "$llmtrain" data prepare --input "$text" --tokenizer "$dir/$name.model" --output "$dir/$name" \
    --append-eod >&2
fi

echo "==> corpus: $(du -h "$text" | cut -f1) of text, $("$llmtrain" data inspect "$dir/$name" --show 0 |
  awk '/^(documents|tokens) /{printf "%s %s ", $2, $1}')" >&2
echo "vocab_size=$vocab"
echo "data_prefix=$dir/$name"
echo "tokenizer=$dir/$name.model"
