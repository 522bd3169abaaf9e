#!/usr/bin/python3
"""log.tensorboard: the event files llmtrain writes are read by TensorBoard itself.

TensorBoard comes from pip (Debian has no package; docs REFERENCE: a test-side package may), into
a venv outside the checkout (tests/e2e/pip_venv.py), reused between runs. Exit 77 (skipped) when pip
cannot install it here.

1. A 10-step run with validation every 5 steps: TensorBoard's EventAccumulator (which checks each
   record's CRC-32C) lists exactly the numeric values of metrics.jsonl under the same names
   (nested keys joined with '/': loss, lr, grad_norm, tokens_per_s, mfu, loss_scale,
   step_time_s, skipped, data_wait_s, peak_bytes/<category>, val_loss), each at every step it
   appears in metrics.jsonl (val_loss at 5 and 10), equal to metrics.jsonl's value as a float32
   (relative 1e-6; 1e-5 for the timings, which metrics.jsonl prints to 6 digits).
2. A run killed (SIGKILL) during step 8 with checkpoints every 3 steps, resumed from step 6: the
   event files of both runs in one folder read as steps 1..10 once each, steps 7..10 with the
   resumed run's values (the resumed writer's SessionLog START at step 7 purges the killed run's
   step 7)."""
import argparse
import json
import os
import shutil
import subprocess
import sys

from pip_venv import venv_python

READ = r"""
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
"""


def train(args, run_dir, sets, env=None, expect_rc=0):
    cmd = [args.llmtrain, "train", "--config", args.config, "-q", "--set",
           f"train.run_dir={run_dir}", "--set", "log.tensorboard=true"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != expect_rc:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}, expected {expect_rc}\n"
                 f"{r.stdout}{r.stderr}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def read(py, folder):
    r = subprocess.run([py, "-c", READ, folder], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


SIX_DIGITS = {"tokens_per_s", "mfu", "step_time_s", "data_wait_s", "checkpoint_s", "comm_wait_s"}


def flatten(obj, prefix=""):
    """{tag: value} of a metrics line's numbers (booleans as 0/1), nested keys joined with '/'."""
    out = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        elif k != "step" or prefix:
            out[prefix + k] = float(v) if v is not None else float("nan")
    return out


def f32_equal(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(b), 1e-30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    py = venv_python("tbvenv", ["tensorboard"], "import tensorboard")
    failures = []

    run1 = os.path.join(args.workdir, "run")
    shutil.rmtree(run1, ignore_errors=True)
    metrics = train(args, run1, ["train.steps=10", "train.eval_interval=5", "train.eval_iters=1"])
    got = read(py, os.path.join(run1, "tensorboard"))
    want = {}  # tag -> [(step, value)] from metrics.jsonl
    for m in metrics:
        for tag, v in flatten(m).items():
            want.setdefault(tag, []).append((m["step"], v))
    if sorted(got) != sorted(want):
        failures.append(f"TensorBoard tags {sorted(got)} are not metrics.jsonl's {sorted(want)}")
    for tag in sorted(set(got) & set(want)):
        series = [(s, v) for s, v in got[tag]]
        rel = 1e-5 if tag in SIX_DIGITS else 1e-6
        if [s for s, _ in series] != [s for s, _ in want[tag]]:
            failures.append(f"{tag}: steps {[s for s, _ in series]}, metrics.jsonl "
                            f"{[s for s, _ in want[tag]]}")
        elif not all(f32_equal(v, w, rel) for (_, v), (_, w) in zip(series, want[tag])):
            failures.append(f"{tag}: TensorBoard {series[:3]}..., metrics.jsonl {want[tag][:3]}...")
    for tag in ["loss", "lr", "grad_norm", "peak_bytes/activations", "peak_bytes/total"]:
        if [s for s, _ in got.get(tag, [])] != list(range(1, 11)):
            failures.append(f"{tag}: not at steps 1..10: {got.get(tag)}")
    if [s for s, _ in got.get("val_loss", [])] != [5, 10]:
        failures.append(f"val_loss at steps {[s for s, _ in got.get('val_loss', [])]}, not 5, 10")
    print(f"run of 10 steps: {len(got)} scalar tags read back by TensorBoard "
          f"{sorted(got)}; loss at step 10 {got['loss'][-1][1]:.6f}")

    run2 = os.path.join(args.workdir, "resumed")
    shutil.rmtree(run2, ignore_errors=True)
    sets = ["train.steps=10", f"checkpoint.dir={os.path.join(run2, 'ckpt')}",
            "checkpoint.interval=3"]
    env = {**os.environ, "LLMTRAIN_FAULT": "forward:8:0:KILL"}
    train(args, run2, sets, env=env, expect_rc=-9)
    resumed = train(args, run2, sets + ["checkpoint.load=latest"])
    files = sorted(os.listdir(os.path.join(run2, "tensorboard")))
    loss = read(py, os.path.join(run2, "tensorboard")).get("loss", [])
    steps = [s for s, _ in loss]
    by_step = {m["step"]: m["loss"] for m in resumed}
    if steps != list(range(1, 11)):
        failures.append(f"killed and resumed: TensorBoard reads steps {steps}, expected 1..10 once")
    elif not all(f32_equal(v, by_step[s]) for s, v in loss if s >= 7):
        failures.append(f"steps 7..10 are not the resumed run's: {loss[6:]} vs {by_step}")
    print(f"killed during step 8, resumed from step 6: {len(files)} event files read as steps "
          f"{steps[0] if steps else None}..{steps[-1] if steps else None}, {len(steps)} points")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
