#!/usr/bin/python3
"""log.tensorboard: the event files llmtrain writes are read by TensorBoard itself.

TensorBoard comes from pip (Debian has no package; docs REFERENCE: a test-side package may), into
a venv made with --system-site-packages in the work folder, reused between runs. Exit 77
(skipped) when pip cannot install it here.

1. A 10-step run with validation every 5 steps: TensorBoard's EventAccumulator (which checks each
   record's CRC-32C) lists train/loss, lr, grad_norm, tokens_per_s, mfu, loss_scale, step_time_s,
   memory/peak_<category>_bytes and val/loss, at steps 1..10 (val at 5 and 10), each equal to metrics.jsonl's value as a
   float32 (relative 1e-6; 1e-5 for tokens_per_s, mfu and step_time_s, which metrics.jsonl
   prints to 6 digits).
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

READ = r"""
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
"""
TAGS = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
        "train/tokens_per_s": "tokens_per_s", "train/mfu": "mfu", "train/loss_scale": "loss_scale",
        "train/step_time_s": "step_time_s"}


def venv_python(work):
    venv = os.path.join(work, "tbvenv")
    py = os.path.join(venv, "bin", "python")
    ok = os.path.exists(py) and subprocess.run(
        [py, "-c", "import tensorboard"], capture_output=True).returncode == 0
    if not ok:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                       check=True)
        r = subprocess.run([py, "-m", "pip", "install", "-q", "tensorboard"], capture_output=True,
                           text=True)
        if r.returncode != 0:
            print(f"SKIP: pip cannot install tensorboard here:\n{r.stdout}{r.stderr}")
            sys.exit(77)
    return py


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


SIX_DIGITS = {"tokens_per_s", "mfu", "step_time_s"}


def f32_equal(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(b), 1e-30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    py = venv_python(args.workdir)
    failures = []

    run1 = os.path.join(args.workdir, "run")
    shutil.rmtree(run1, ignore_errors=True)
    metrics = train(args, run1, ["train.steps=10", "train.eval_interval=5", "train.eval_iters=1"])
    got = read(py, os.path.join(run1, "tensorboard"))
    for tag, key in TAGS.items():
        series = got.get(tag, [])
        if [s for s, _ in series] != list(range(1, 11)):
            failures.append(f"{tag}: steps {[s for s, _ in series]}, expected 1..10")
            continue
        rel = 1e-5 if key in SIX_DIGITS else 1e-6
        bad = [(s, v, m[key]) for (s, v), m in zip(series, metrics)
               if not f32_equal(v, m[key], rel)]
        if bad:
            failures.append(f"{tag}: differs from metrics.jsonl at {bad[:3]}")
    for cat in ("params", "grads", "optimizer", "activations", "comm", "total"):
        series = got.get(f"memory/peak_{cat}_bytes", [])
        want = [m["peak_bytes"][cat] for m in metrics]
        if [v for _, v in series] != [float(w) for w in want] and not all(
                f32_equal(v, w) for (_, v), w in zip(series, want)):
            failures.append(f"memory/peak_{cat}_bytes {series[:2]}..., metrics.jsonl {want[:2]}...")
    val = got.get("val/loss", [])
    want_val = [[m["step"], m["val_loss"]] for m in metrics if "val_loss" in m]
    if [s for s, _ in val] != [5, 10] or not all(
            f32_equal(v, w) for (_, v), (_, w) in zip(val, want_val)):
        failures.append(f"val/loss {val}, metrics.jsonl {want_val}")
    print(f"run of 10 steps: {len(got)} scalar tags read back by TensorBoard "
          f"{sorted(got)}; loss at step 10 {got['train/loss'][-1][1]:.6f}")

    run2 = os.path.join(args.workdir, "resumed")
    shutil.rmtree(run2, ignore_errors=True)
    sets = ["train.steps=10", f"checkpoint.dir={os.path.join(run2, 'ckpt')}",
            "checkpoint.interval=3"]
    env = {**os.environ, "LLMTRAIN_FAULT": "forward:8:0:KILL"}
    train(args, run2, sets, env=env, expect_rc=-9)
    resumed = train(args, run2, sets + ["checkpoint.load=latest"])
    files = sorted(os.listdir(os.path.join(run2, "tensorboard")))
    loss = read(py, os.path.join(run2, "tensorboard")).get("train/loss", [])
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
