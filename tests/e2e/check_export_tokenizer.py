#!/usr/bin/python3
"""`checkpoint export` writes the run's tokenizer beside the weights, and Hugging Face's
AutoTokenizer.from_pretrained(OUT) encodes text to exactly the ids llmtrain trained on.

A SentencePiece tokenizer trained by `llmtrain data tokenizer-train`, a dataset from `data
prepare --append-eod`, a 2-step run on it with a checkpoint, then `checkpoint export`. transformers
comes from pip into a venv (transformers, protobuf and sentencepiece all from pip) outside the
checkout (tests/e2e/pip_venv.py), reused between runs; exit 77 (skipped) when pip cannot install
it. Checked: every
document's AutoTokenizer ids (slow and fast tokenizers, special tokens on) equal the dataset's
ids without the end-of-document token (no BOS is added, as the dataset has none), decode gives
the text back, and config.json and the tokenizer agree on the bos/eos ids; `--tokenizer none`
exports the weights alone, and a tokenizer that normalizes text (trained with SentencePiece's
defaults by its own Python package) is refused with the reason."""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from check_megatron_format import read_dataset  # noqa: E402  (the independent numpy reader)
from pip_venv import venv_python  # noqa: E402

ENCODE = r"""
import json, sys
from transformers import AutoTokenizer
out, texts = sys.argv[1], json.load(open(sys.argv[2]))
res = {}
for fast in (False, True):
    tok = AutoTokenizer.from_pretrained(out, use_fast=fast)
    ids = [tok(t)["input_ids"] for t in texts]
    res["fast" if fast else "slow"] = {
        "class": type(tok).__name__, "ids": ids, "bos": tok.bos_token_id, "eos": tok.eos_token_id,
        "decoded": [tok.decode(i) for i in ids]}
print(json.dumps(res))
"""


def run(cmd, expect_rc=0):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != expect_rc:
        sys.exit(f"FAIL: {' '.join(map(str, cmd))} exited {r.returncode}\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def hf_python():
    # --ignore-installed: Debian's sentencepiece (seen through the system site packages) carries
    # protobuf code that today's protobuf refuses to load.
    return venv_python("hfvenv", ["transformers", "protobuf", "sentencepiece"],
                       "import transformers, google.protobuf, sentencepiece\n"
                       "assert not sentencepiece.__file__.startswith('/usr/')",
                       ["--ignore-installed"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    work = args.workdir
    os.makedirs(work, exist_ok=True)
    py = hf_python()
    for d in ("ds", "run", "out", "out-none", "out-nfkc"):
        shutil.rmtree(os.path.join(work, d), ignore_errors=True)

    rng = random.Random(7)
    words = ("the model learns from text every token is one piece of words and data flows "
             "through layers while loss falls slowly quick brown fox jumps over lazy dog "
             "café naïve résumé 2024 3.14 x=y+1").split()
    sentence = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + "."
    docs = ["\n".join(sentence() for _ in range(rng.randint(1, 3))) for _ in range(200)]
    text = os.path.join(work, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n\n".join(docs) + "\n")
    tok = os.path.join(work, "tok.model")
    run([args.llmtrain, "data", "tokenizer-train", "--input", text, "--vocab-size", 400,
         "--byte-fallback", "on", "--output", tok])
    prefix = os.path.join(work, "ds", "corpus")
    run([args.llmtrain, "data", "prepare", "--input", text, "--tokenizer", tok, "--output", prefix,
         "--append-eod"])
    _, dataset = read_dataset(prefix)
    want = [d[0].tolist() for d in dataset]
    eos = want[0][-1]
    if len(want) != len(docs) or not all(w[-1] == eos for w in want):
        sys.exit(f"FAIL: the dataset has {len(want)} documents ending in {eos}, expected "
                 f"{len(docs)}")

    run_dir = os.path.join(work, "run")
    sets = ["model.vocab_size=512", "train.steps=2", f"train.run_dir={run_dir}",
            "data.source=indexed",
            f"data.path={prefix}", f"data.tokenizer={tok}", "data.split=90,10,0",
            f"checkpoint.dir={run_dir}/ckpt", "checkpoint.interval=2", "log.progress=false"]
    run([args.llmtrain, "train", "--config", args.config, "-q"] +
        [a for s in sets for a in ("--set", s)])
    out = os.path.join(work, "out")
    printed = run([args.llmtrain, "checkpoint", "export", f"{run_dir}/ckpt", out])
    files = sorted(os.listdir(out))
    failures = []
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        if name not in files:
            failures.append(f"export wrote {files}, no {name}")
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)

    texts_path = os.path.join(work, "texts.json")
    with open(texts_path, "w") as f:
        json.dump(docs, f)
    r = subprocess.run([py, "-c", ENCODE, out, texts_path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: AutoTokenizer on {out}:\n{r.stdout}{r.stderr}")
    got = json.loads(r.stdout)
    for kind, g in got.items():
        bad = [i for i, (ids, w) in enumerate(zip(g["ids"], want)) if ids != w[:-1]]
        if bad:
            i = bad[0]
            failures.append(f"{kind} {g['class']}: {len(bad)} of {len(docs)} documents differ; "
                            f"first {i}: {g['ids'][i][:12]} vs llmtrain {want[i][:12]}")
        undecoded = [i for i, (d, t) in enumerate(zip(g["decoded"], docs)) if d != t]
        if undecoded:
            failures.append(f"{kind}: decode differs from the text for {len(undecoded)} documents")
        if (g["bos"], g["eos"]) != (config["bos_token_id"], config["eos_token_id"]) or \
                g["eos"] != eos:
            failures.append(f"{kind}: tokenizer bos/eos {g['bos']}/{g['eos']}, config.json "
                            f"{config['bos_token_id']}/{config['eos_token_id']}, dataset eos {eos}")
        print(f"{kind} {g['class']}: {len(docs)} documents encode to llmtrain's ids "
              f"({sum(len(w) - 1 for w in want)} tokens); bos {g['bos']} eos {g['eos']}")

    none_out = os.path.join(work, "out-none")
    run([args.llmtrain, "checkpoint", "export", f"{run_dir}/ckpt", none_out, "--tokenizer", "none"])
    if sorted(os.listdir(none_out)) != ["config.json", "model.safetensors"]:
        failures.append(f"--tokenizer none wrote {sorted(os.listdir(none_out))}")
    # A tokenizer that normalizes (NFKC, folded whitespace: SentencePiece's defaults) is refused.
    import sentencepiece as spm
    nfkc = os.path.join(work, "nfkc")
    spm.SentencePieceTrainer.train(input=text, model_prefix=nfkc, vocab_size=200, model_type="bpe",
                                   minloglevel=2)
    refused = run([args.llmtrain, "checkpoint", "export", f"{run_dir}/ckpt",
                   os.path.join(work, "out-nfkc"), "--tokenizer", nfkc + ".model"], expect_rc=2)
    if "does not encode text as it is" not in refused or os.path.exists(
            os.path.join(work, "out-nfkc")):
        failures.append(f"a normalizing tokenizer was not refused:\n{refused}")
    print(printed.strip().splitlines()[-1])
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
