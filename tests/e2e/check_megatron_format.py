"""The Megatron indexed dataset from both sides, with a reader written here from the format
description alone (docs/data.md, "The dataset format"; numpy memmap, not our code):
  1. `llmtrain data tokenizer-train` + `data prepare` on text and JSONL: every document read back
     here is exactly SentencePiece's ids for it (python3-sentencepiece) + eos, and
     `data inspect --verify` reports the same counts and decodes the same text.
  2. datasets written here with numpy as Megatron-LM writes them (uint16 and int32; documents
     split into several sequences; a document with none) load in `llmtrain data inspect --verify`
     with the same counts and ids, and a token id >= vocab size fails with the exact error.
Run by ctest (tests/e2e/data.cmake):
  /usr/bin/python3 check_megatron_format.py --llmtrain build/app/llmtrain --workdir /tmp/x
"""
import argparse
import json
import pathlib
import random
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import sentencepiece as spm

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
MAGIC = b"MMIDIDX\x00\x00"


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)
    print("ok:", msg)


def run(cmd, expect_rc=0):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if proc.returncode != expect_rc:
        sys.exit(f"FAIL: {' '.join(map(str, cmd))} exited {proc.returncode}, expected {expect_rc}\n"
                 f"{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def read_dataset(prefix):
    """(dtype, list of documents, each a list of sequences (np arrays))."""
    idx = np.memmap(f"{prefix}.idx", dtype=np.uint8, mode="r")
    assert bytes(idx[:9]) == MAGIC, "magic"
    version, code, n_seq, n_doc_idx = struct.unpack("<QBQQ", bytes(idx[9:34]))
    assert version == 1, "version"
    dtype = np.dtype(DTYPES[code])
    off = 34
    lengths = np.frombuffer(idx, dtype="<i4", count=n_seq, offset=off)
    off += 4 * n_seq
    pointers = np.frombuffer(idx, dtype="<i8", count=n_seq, offset=off)
    off += 8 * n_seq
    doc_idx = np.frombuffer(idx, dtype="<i8", count=n_doc_idx, offset=off)
    assert off + 8 * n_doc_idx == len(idx), "idx size"
    bin_ = np.memmap(f"{prefix}.bin", dtype=dtype.newbyteorder("<"), mode="r")
    seqs = [np.asarray(bin_[p // dtype.itemsize: p // dtype.itemsize + n])
            for p, n in zip(pointers, lengths)]
    docs = [seqs[doc_idx[d]:doc_idx[d + 1]] for d in range(n_doc_idx - 1)]
    return dtype, docs


def write_dataset(prefix, dtype, docs):
    """docs: list of documents, each a list of sequences (lists of ids); Megatron's layout."""
    dtype = np.dtype(dtype)
    seqs = [np.asarray(s, dtype=dtype) for d in docs for s in d]
    lengths = np.array([len(s) for s in seqs], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64) * dtype.itemsize])
    doc_idx = np.cumsum([0] + [len(d) for d in docs], dtype=np.int64)
    code = {v: k for k, v in DTYPES.items()}[dtype.type]
    with open(f"{prefix}.idx", "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", 1, code, len(seqs), len(doc_idx)))
        f.write(lengths.tobytes() + pointers[:len(seqs)].astype("<i8").tobytes()
                + doc_idx.astype("<i8").tobytes())
    with open(f"{prefix}.bin", "wb") as f:
        for s in seqs:
            f.write(s.astype(dtype.newbyteorder("<")).tobytes())


def inspect_counts(out):
    return {k: int(v) for k, v in re.findall(r"^(documents|sequences|tokens) (\d+)$", out, re.M)}


def ours_read_by_numpy(args, work):
    rng = random.Random(5)
    words = ("the model learns from text every token is one piece of words and data flows "
             "through layers while loss falls slowly quick brown fox jumps over lazy dog "
             "café naïve résumé").split()
    sentence = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + "."
    blocks = ["\n".join(sentence() for _ in range(rng.randint(1, 4))) for _ in range(300)]
    (work / "a.txt").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    records = [sentence() for _ in range(200)] + [""]
    (work / "b.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(records)),
        encoding="utf-8")
    inputs = [work / "a.txt", work / "b.jsonl"]

    run([args.llmtrain, "data", "tokenizer-train", "--input", *inputs, "--vocab-size", 200,
         "--output", work / "tok.model"])
    out = run([args.llmtrain, "data", "prepare", "--input", *inputs, "--tokenizer",
               work / "tok.model", "--output", work / "ds" / "corpus", "--append-eod"])
    check("1 empty ones skipped" in out, "the empty JSONL document is skipped")

    sp = spm.SentencePieceProcessor(model_file=str(work / "tok.model"))
    texts = blocks + [t for t in records if t]
    want = [sp.encode(t) + [sp.eos_id()] for t in texts]
    dtype, docs = read_dataset(work / "ds" / "corpus")
    check(dtype == np.uint16, f"vocab 200 -> uint16 tokens (got {dtype})")
    check(len(docs) == len(texts) and all(len(d) == 1 for d in docs),
          f"{len(texts)} documents of one sequence each (got {len(docs)})")
    bad = [i for i, (d, w) in enumerate(zip(docs, want)) if d[0].tolist() != w]
    check(not bad, f"every document == SentencePiece ids + eos (first mismatch: {bad[:1]})")

    out = run([args.llmtrain, "data", "inspect", work / "ds" / "corpus", "--tokenizer",
               work / "tok.model", "--verify", "--show", 1])
    n_tok = sum(len(w) for w in want)
    check(inspect_counts(out) == {"documents": len(texts), "sequences": len(texts), "tokens": n_tok},
          f"inspect counts {inspect_counts(out)} == numpy's ({len(texts)} docs, {n_tok} tokens)")
    check("dtype uint16" in out and "verify: ok" in out, "inspect: dtype and verify")
    check(sp.decode(want[0]) in out, "inspect decodes document 0 as SentencePiece does")


def numpy_written_load_in_llmtrain(args, work):
    cases = {
        # Megatron with sentence splitting: several sequences per document, and a document
        # that tokenized to nothing has no sequence at all.
        "u16": (np.uint16, [[[5, 6, 7], [8]], [], [[999, 0]], [[1, 2, 3, 4]]], 1000),
        "i32": (np.int32, [[[70000, 1]], [[123456, 2, 3]]], 200000),
    }
    for name, (dtype, docs, vocab) in cases.items():
        prefix = work / name
        write_dataset(prefix, dtype, docs)
        seqs = [s for d in docs for s in d]
        out = run([args.llmtrain, "data", "inspect", prefix, "--verify", "--vocab-size", vocab,
                   "--show", len(docs)])
        want = {"documents": len(docs), "sequences": len(seqs),
                "tokens": sum(len(s) for s in seqs)}
        check(inspect_counts(out) == want, f"{name}: inspect counts {inspect_counts(out)} == {want}")
        shown = re.findall(r"^--- document \d+ \(\d+ tokens\)\n(.*)$", out, re.M)
        check(shown == [" ".join(str(t) for s in d for t in s) for d in docs],
              f"{name}: every document's ids")
        check(f"dtype {np.dtype(dtype).name}" in out, f"{name}: dtype {np.dtype(dtype).name}")

    write_dataset(work / "bad", np.uint16, [[[1, 2]], [[3, 1000, 4]]])
    out = run([args.llmtrain, "data", "inspect", work / "bad", "--verify", "--vocab-size", 1000],
              expect_rc=1)
    want = (f"error: {work}/bad.bin: byte 6 (sequence 1, token 1): token id: expected "
            "0 <= id < 1000 (the vocabulary size), found 1000")
    check(want in out, "a token id >= vocab size fails --verify with the exact error")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--workdir", required=True, type=pathlib.Path)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    ours_read_by_numpy(args, args.workdir)
    numpy_written_load_in_llmtrain(args, args.workdir)


if __name__ == "__main__":
    main()
