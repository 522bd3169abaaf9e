"""End-to-end checks of `llmtrain train` on tiny configs: the loss falls, metrics.jsonl holds
every documented field, and the mixed-precision logic (bf16 rounding, fp16 loss scaling with
skipped steps) behaves as specified. Run by ctest; see --help."""
import argparse
import json
import math
import pathlib
import subprocess
import sys


def train(llmtrain, config, run_dir, *sets):
    cmd = [llmtrain, "train", "--config", str(config), "--set", f"train.run_dir={run_dir}"]
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


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--llmtrain", required=True)
    p.add_argument("--config", required=True, type=pathlib.Path)
    p.add_argument("--workdir", required=True, type=pathlib.Path)
    p.add_argument("check", choices=["quickstart", "precision"])
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    {"quickstart": quickstart, "precision": precision}[args.check](args)


if __name__ == "__main__":
    main()
