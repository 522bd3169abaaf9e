#!/usr/bin/python3
"""[offload] "nvme" against the same run without it, layout by layout: per step the loss and
grad norm bitwise, and the checkpoint of the last step bitwise (every dataset of every rank's
file, read with h5py). Also: the offloaded categories' device bytes gone (peak_bytes) and in the
files (offload_bytes), nothing left in nvme_dir after the run, and a disk that cannot hold the
state (here a file size limit: RLIMIT_FSIZE, SIGXFSZ ignored) stopping the run with exit 1 and a
message naming the directory. Prints one line per layout."""
import glob
import os
import shutil
import subprocess

import h5py
import numpy as np

from harness import finish, parse_args, train

OPT = ["offload.optimizer=nvme"]
BOTH = OPT + ["offload.params=nvme"]
# layout: (ranks, its --set overrides, the offload settings). Small chunks (buffer_mb 1), so the
# state streams in several pieces.
LAYOUTS = {
    "single-zero3": (1, ["parallel.zero_stage=3"], BOTH),
    "single-zero3-bf16": (1, ["parallel.zero_stage=3", "train.precision=bf16"], BOTH),
    "single-ddp": (1, [], OPT),
    "zero1-dp2-bf16": (2, ["parallel.zero_stage=1", "train.precision=bf16"], OPT),
    "zero3-dp2": (2, ["parallel.zero_stage=3"], BOTH),
    "pp2-zero3": (2, ["parallel.pp=2", "parallel.zero_stage=3"], BOTH),
}
COMMON = ["train.threads=1", "log.progress=false", "train.steps=4", "checkpoint.interval=4"]


def datasets(ckpt):
    """Every dataset of every HDF5 file under the checkpoint folder: {file/name: array}."""
    out = {}
    for path in sorted(glob.glob(os.path.join(ckpt, "**", "*.h5"), recursive=True)):
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out[f"{os.path.relpath(path, ckpt)}/{name}"] = obj[()]
            f.visititems(visit)
    return out


def main():
    args = parse_args()
    failures = []
    nvme = os.path.join(args.workdir, "nvme")
    for name, (ranks, sets, offload) in LAYOUTS.items():
        base = sets + COMMON
        runs = {}
        for kind, extra in (("plain", []), ("offload", offload + [f"offload.nvme_dir={nvme}",
                                                                  "offload.buffer_mb=1"])):
            shutil.rmtree(nvme, ignore_errors=True)
            os.makedirs(nvme)
            out = os.path.join(args.workdir, f"{name}-{kind}")
            ck = os.path.join(out, "ck")
            runs[kind] = (train(args, out, ranks, base + extra + [f"checkpoint.dir={ck}"]), ck)
            if os.listdir(nvme):
                failures.append(f"{name}: {os.listdir(nvme)} left in nvme_dir")
        (a, ck_a), (b, ck_b) = runs["plain"], runs["offload"]
        for x, y in zip(a, b):
            for k in ("loss", "grad_norm"):
                if x[k] != y[k]:
                    failures.append(f"{name}: step {x['step']} {k} {y[k]!r} with offload, "
                                    f"{x[k]!r} without")
        da, db = datasets(ck_a), datasets(ck_b)
        differ = [k for k in da if k not in db or not np.array_equal(da[k], db[k])]
        if not da or differ or set(da) != set(db):
            failures.append(f"{name}: checkpoints differ in {differ[:5]} ({len(da)} datasets)")
        if name == "single-zero3":
            # eval and generate reset the layout (and the offload) of the stored config: the
            # same loss from both checkpoints, no offload folder needed.
            evals = [subprocess.run([args.llmtrain, "eval", "--checkpoint", ck, "--iters", "1",
                                     "--set", "train.threads=1"], capture_output=True, text=True)
                     for ck in (ck_a, ck_b)]
            losses = [e.stdout.split(": loss ")[-1] for e in evals]
            if any(e.returncode for e in evals) or losses[0] != losses[1]:
                failures.append(f"eval of the offloaded run's checkpoint: "
                                f"{[(e.returncode, e.stdout, e.stderr[-300:]) for e in evals]}")
            print(f"{name}: eval of both checkpoints: loss {losses[0].strip()}, "
                  f"{losses[1].strip()}")
        last = b[-1]
        moved = {k: v for k, v in last.get("offload_bytes", {}).items()}
        kept = {k: last["peak_bytes"][k] - a[-1]["peak_bytes"][k] for k in moved}
        print(f"{name}: {len(a)} steps bitwise, {len(da)} checkpoint datasets bitwise; in files "
              f"{moved}, device bytes changed by {kept}, resident peak {last['rss_peak_bytes']}")
        if "optimizer" not in moved or last["peak_bytes"]["optimizer"] != 0:
            failures.append(f"{name}: optimizer state not in the files: {moved}, "
                            f"{last['peak_bytes']}")
        for k, v in moved.items():
            if kept[k] != -v:
                failures.append(f"{name}: {k}: {v} B in files, device peak changed by {kept[k]}")
    # A disk that cannot hold the state: exit 1 naming the directory.
    os.makedirs(nvme, exist_ok=True)
    cmd = (f"trap '' XFSZ; ulimit -f 1; exec {args.llmtrain} train --config {args.config} -q "
           f"--set train.threads=1 --set train.steps=2 --set parallel.zero_stage=3 "
           f"--set offload.optimizer=nvme --set offload.params=nvme "
           f"--set offload.nvme_dir={nvme} --set train.run_dir={args.workdir}/full")
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    print(f"full disk: exit {p.returncode}: {p.stderr.strip()[-300:]}")
    if p.returncode != 1 or nvme not in p.stderr or "cannot hold" not in p.stderr:
        failures.append(f"a disk that cannot hold the state: exit {p.returncode}, {p.stderr!r}")
    if os.listdir(nvme):
        failures.append(f"{os.listdir(nvme)} left in nvme_dir after the failed run")
    # A directory that does not exist: exit 1 naming it.
    missing = os.path.join(args.workdir, "missing")
    p = subprocess.run([args.llmtrain, "train", "--config", args.config, "-q", "--set",
                        "train.steps=2", "--set", "offload.optimizer=nvme", "--set",
                        f"offload.nvme_dir={missing}", "--set",
                        f"train.run_dir={args.workdir}/missing-run"], capture_output=True, text=True)
    print(f"missing directory: exit {p.returncode}: {p.stderr.strip()[-200:]}")
    if p.returncode != 1 or missing not in p.stderr:
        failures.append(f"a missing nvme_dir: exit {p.returncode}, {p.stderr!r}")
    finish(failures)


if __name__ == "__main__":
    main()
