"""Shared by the mpirun test scripts (parity.py, recompute.py, precision_tp.py, volume_memory.py,
tp_volume.py, checkpoint_reshard.py, grad_dtype.py, fp8.py): their common arguments, running a
command (failing the test with its output), a training run's metrics, the resolved config, the
micro-batch-size noise of a run, and the verdict."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def parse_args(extra=None):
    """--llmtrain, --mpirun, --config, --workdir, --set KEY=VALUE (repeatable: settings for every
    run a script makes, its single-rank references included); `extra(ap)` adds a script's own
    arguments."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    if extra:
        extra(ap)
    return ap.parse_args()


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}\n{r.stdout}")
    return r.stdout


def resolved_config(args, sets):
    """`llmtrain config show` of args.config with `sets` ("key=value"): (text, {key: value})."""
    cmd = [args.llmtrain, "config", "show", "--config", args.config]
    for s in sets:
        cmd += ["--set", s]
    shown = run(cmd)
    return shown, dict(re.findall(r"^(\w+) = (\S+)$", shown, re.M))


def train(args, out, ranks, sets, dump_final=False):
    """Trains args.config into the folder `out` (emptied first) with `--set` for each of `sets`,
    on one rank, or under mpirun on `ranks`. Returns the per-step metrics (metrics.jsonl); with
    dump_final the final parameters are in out/final/params.bin (--dump-final)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.llmtrain, "train", "--config", args.config, "-q"]
    if dump_final:
        cmd += ["--dump-final", os.path.join(out, "final")]
    for s in sets + [f"train.run_dir={out}"]:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, "--oversubscribe", "-np", str(ranks)] + cmd
    run(cmd)
    return metrics(out)


def split_noise(args, workdir, name, sets, ref):
    """The micro-batch-size noise of the single-rank run `ref` (its metrics, made with `sets`):
    the largest per-step loss difference to the runs that split the same batches into micro-batches
    of 8, 4 and 1 instead (the same sums in other orders), trained into workdir/NAME-mbsM."""
    splits = [train(args, os.path.join(workdir, f"{name}-mbs{m}"), 1,
                    sets + [f"train.micro_batch_size={m}"]) for m in (8, 4, 1)]
    return max(abs(a["loss"] - b["loss"]) for run in splits for a, b in zip(ref, run))


def metrics(run_dir):
    """The complete lines of run_dir/metrics.jsonl ([] before the first): a run may be writing."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def finish(failures):
    """Fails the test listing `failures`, or prints OK."""
    if failures:
        sys.exit("FAIL:\n  " + "\n  ".join(failures))
    print("OK")
