"""End-to-end checks of `llmtrain train` on tiny configs: the loss falls, metrics.jsonl holds
every documented field, and the mixed-precision logic (bf16 rounding, fp16 loss scaling with
skipped steps) behaves as specified. Run by ctest; see --help."""
import argparse
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys


def train(llmtrain, config, run_dir, *sets):
    # A fresh run each time (an earlier test run's files would be refused: docs/configuration.md,
    # "Run directories"). Checkpoints (the quickstart config saves them) stay inside the run's folder.
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [llmtrain, "train", "--config", str(config), "--set", f"train.run_dir={run_dir}",
           "--set", f"checkpoint.dir={run_dir}/checkpoints"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    rows = [json.loads(l) for l in (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return proc.stdout, rows


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)
    print("ok:", msg)


def quickstart(args):
    out, rows = train(args.llmtrain, args.config, args.workdir / "quick", "train.steps=60")
    check(len(rows) == 60, f"60 metric rows (got {len(rows)})")
    keys = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_bytes"}
    check(keys <= rows[0].keys(), f"metrics keys {sorted(keys)} present")
    cats = {"params", "grads", "optimizer", "activations", "total"}
    check(cats <= rows[0]["peak_bytes"].keys(), "peak_bytes per category")
    check(rows[0]["peak_bytes"]["optimizer"] == 2 * rows[0]["peak_bytes"]["params"],
          "AdamW state = 2 x fp32 params: "
          f"{rows[0]['peak_bytes']['optimizer']} vs {rows[0]['peak_bytes']['params']}")
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
    check(abs(first - math.log(512)) < 0.2, f"initial loss {first:.4f} ~ ln(512) = {math.log(512):.4f}")
    check(last < first - 1.5, f"loss falls: step 1 {first:.4f} -> last 5 mean {last:.4f}")
    check("eta" in out and "tok/s" in out, "progress line printed")


def precision(args):
    common = ["train.steps=24", "log.progress=false"]
    _, f32 = train(args.llmtrain, args.config, args.workdir / "fp32", *common)
    _, b16 = train(args.llmtrain, args.config, args.workdir / "bf16", *common, 'train.precision="bf16"')
    rel = abs(b16[0]["loss"] - f32[0]["loss"]) / f32[0]["loss"]
    check(0 < rel < 1e-2, f"bf16 step-1 loss within 1% of fp32 but not equal (rel {rel:.2e})")
    check(all(not r["skipped"] for r in b16), "bf16 never skips a step")
    # fp16 at the default scale (2^16) trains like fp32, step by step.
    _, h16 = train(args.llmtrain, args.config, args.workdir / "fp16", *common, 'train.precision="fp16"')
    worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(h16, f32))
    check(not any(r["skipped"] for r in h16) and 0 < worst < 2e-2,
          f"fp16 losses within 2% of fp32 at every step (worst {worst:.2e})")
    # fp16 at 2^40 overflows the 16-bit gradients: the scaler must skip and halve until they
    # fit, then train.
    _, over = train(args.llmtrain, args.config, args.workdir / "fp16_overflow", *common,
                    'train.precision="fp16"', "optimizer.initial_loss_scale=1099511627776.0")
    skipped = [r["skipped"] for r in over]
    scales = [r["loss_scale"] for r in over]
    check(skipped[0] and over[0]["grad_norm"] is None, "fp16 step 1 at scale 2^40 overflows and is skipped")
    for a, b, s in zip(scales, scales[1:], skipped):
        check(b == (a / 2 if s else a), f"scale {a:g} -> {b:g} after skipped={s}")
    n_skip = sum(skipped)
    check(skipped == [True] * n_skip + [False] * (len(over) - n_skip) and n_skip < len(over) - 4,
          f"{n_skip} skipped steps, then every step applies (final scale {scales[-1]:g})")
    check(over[-1]["loss"] < over[n_skip]["loss"] - 0.1,
          f"fp16 trains after the skips: {over[n_skip]['loss']:.4f} -> {over[-1]['loss']:.4f}")


def text(args):
    """configs/quickstart.toml on the real-text corpus that scripts/corpus.sh builds (into the
    workdir here): the loss falls from ln(2048), validation runs every eval_interval steps."""
    corpus = subprocess.run(["bash", str(args.config.parent.parent / "scripts" / "corpus.sh"),
                             args.llmtrain], capture_output=True, text=True,
                            env={**os.environ, "LLMT_CORPUS_DIR": str(args.workdir / "corpus")})
    if corpus.returncode != 0:
        sys.exit(f"FAIL: scripts/corpus.sh exited {corpus.returncode}\n{corpus.stderr}")
    made = dict(line.split("=", 1) for line in corpus.stdout.split())
    out, rows = train(args.llmtrain, args.config, args.workdir / "text", "train.steps=40",
                      "train.eval_interval=20", f"data.path={made['data_prefix']}",
                      f"data.tokenizer={made['tokenizer']}")
    check(len(rows) == 40, f"40 metric rows (got {len(rows)})")
    check(all(r["data_wait_s"] >= 0 for r in rows), "data_wait_s in every row")
    evals = [r["step"] for r in rows if "val_loss" in r]
    check(evals == [20, 40], f"val_loss at steps 20 and 40 (got {evals})")
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
    check(abs(first - math.log(2048)) < 0.3, f"initial loss {first:.4f} ~ ln(2048) = {math.log(2048):.4f}")
    check(last < first - 0.8, f"loss falls: step 1 {first:.4f} -> last 5 mean {last:.4f}")
    check(rows[39]["val_loss"] < first - 0.5,
          f"val loss falls: step 1 loss {first:.4f} -> val {rows[39]['val_loss']:.4f} at step 40")
    check("| val " in out and "data: sample 0: " in out, "progress shows val loss, log a decoded sample")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--llmtrain", required=True)
    p.add_argument("--config", required=True, type=pathlib.Path)
    p.add_argument("--workdir", required=True, type=pathlib.Path)
    p.add_argument("check", choices=["quickstart", "precision", "text"])
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    {"quickstart": quickstart, "precision": precision, "text": text}[args.check](args)


if __name__ == "__main__":
    main()
