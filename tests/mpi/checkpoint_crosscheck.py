#!/usr/bin/python3
"""Checkpoint files from the wrong place, and edited run state, are refused (issue: checkpoints
that cannot lie). From a ZeRO-3 dp2 run's checkpoints of steps 2 and 4 (two rank files each,
holding different rows), each case below is a copy of step 2 with one change; `checkpoint
verify` must exit 1 naming what is wrong, and a resume from it must exit 1 too (no training on
wrong weights or a wrong schedule). The unchanged copy verifies and resumes.

Each case runs twice. As saved, the checkpoint's manifest.json refuses the changed file before
HDF5 parses it (verify names the file and the manifest; two cases also resume). With the
manifest deleted (a checkpoint written before manifests, or edited on purpose), the checks
behind it must still refuse each case with their own message, in verify and in a resume.

  swapped       rank_00000.h5 and rank_00001.h5 exchanged
  duplicated    rank_00000.h5 copied over rank_00001.h5
  other_step    rank_00001.h5 from the step-4 checkpoint
  other_index   index.h5 from the step-4 checkpoint
  edited_step   the index's step attribute 2 -> 3 (h5py)
  edited_mesh   the index's mesh attribute forged (tp 2)
  huge_step     step = 10^12
  no_checksum   one box's xxh64 attribute deleted
  int32_index   one index tensor re-created as an int32 virtual dataset over the same boxes
  huge_layers   (verify only) the stored config's n_layers set to 10^9 with the run-state checksum
                deleted, as in a checkpoint older than it: refused at once, naming both counts,
                where verify grew without bound before"""
import re
import os
import shutil
import subprocess

import h5py
import numpy as np

from harness import finish, parse_args, train

SETS = ["parallel.zero_stage=3", "train.steps=4", "checkpoint.interval=2", "checkpoint.keep_last=0",
        "train.threads=1", "log.progress=false"]


def edit_attr(name, value):
    def edit(d):
        with h5py.File(os.path.join(d, "index.h5"), "r+") as f:
            f.attrs[name] = value
    return edit


def swap(d):
    a, b = os.path.join(d, "rank_00000.h5"), os.path.join(d, "rank_00001.h5")
    os.rename(a, a + ".x")
    os.rename(b, a)
    os.rename(a + ".x", b)


def first_box(f):
    found = []
    f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) and not found else None)
    return found[0]


def drop_checksum(d):
    with h5py.File(os.path.join(d, "rank_00000.h5"), "r+") as f:
        del f[first_box(f)].attrs["xxh64"]


def int32_index(d):
    path = os.path.join(d, "index.h5")
    with h5py.File(path, "r+") as f:
        name = "model/wte.weight"
        ds = f[name]
        attrs = dict(ds.attrs)
        layout = h5py.VirtualLayout(shape=ds.shape, dtype="i4")
        for m in ds.virtual_sources():
            lo, hi = m.vspace.get_select_bounds()  # inclusive
            src = h5py.VirtualSource(m.file_name, m.dset_name,
                                     shape=tuple(b - a + 1 for a, b in zip(lo, hi)))
            layout[tuple(slice(a, b + 1) for a, b in zip(lo, hi))] = src
        del f[name]
        new = f.create_virtual_dataset(name, layout)
        for k, v in attrs.items():
            new.attrs[k] = v


def huge_layers(d):
    with h5py.File(os.path.join(d, "index.h5"), "r+") as f:
        config = f.attrs["config"]
        config = config.decode() if isinstance(config, bytes) else config
        f.attrs["config"] = re.sub(r"n_layers = \d+", "n_layers = 1000000000", config)
        del f.attrs["state_xxh64"]


def main():
    args = parse_args()
    w = args.workdir
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    run_dir = os.path.join(w, "run")
    train(args, run_dir, 2, SETS + [f"checkpoint.dir={os.path.join(w, 'ck')}"])
    step2, step4 = (os.path.join(w, "ck", f"step_{s:08d}") for s in (2, 4))
    # name: (change, the message without the manifest, the file the manifest refuses)
    cases = {
        "swapped": (swap, "holds rank 1's data", "rank_00000.h5"),
        "duplicated": (lambda d: shutil.copy(os.path.join(d, "rank_00000.h5"),
                                             os.path.join(d, "rank_00001.h5")),
                       "holds rank 0's data", "rank_00001.h5"),
        "other_step": (lambda d: shutil.copy(os.path.join(step4, "rank_00001.h5"),
                                             os.path.join(d, "rank_00001.h5")),
                       "is from step 4, the index from step 2", "rank_00001.h5"),
        "other_index": (lambda d: shutil.copy(os.path.join(step4, "index.h5"),
                                              os.path.join(d, "index.h5")),
                        "is from step 2, the index from step 4", "index.h5"),
        "edited_step": (edit_attr("step", np.int64(3)), "do not match their checksum", "index.h5"),
        "edited_mesh": (edit_attr("mesh", np.array([2, 1, 2, 1], dtype=np.int64)),
                        "do not match their checksum", "index.h5"),
        "huge_step": (edit_attr("step", np.int64(10**12)), "do not match their checksum",
                      "index.h5"),
        "no_checksum": (drop_checksum, "has no xxh64 attribute", "rank_00000.h5"),
        "int32_index": (int32_index, "is not float32", "index.h5"),
    }
    failures = []
    env = dict(os.environ)

    def verify(d):
        return subprocess.run([args.llmtrain, "checkpoint", "verify", d], capture_output=True,
                              text=True, env=env)

    def resume(d, name):
        cmd = [args.mpirun, "--oversubscribe", "-np", "2", args.llmtrain, "train", "--config",
               args.config, "-q"]
        for s in SETS + [f"train.run_dir={os.path.join(w, 'resume_' + name)}",
                         f"checkpoint.load={d}", "checkpoint.interval=0", "train.steps=6"]:
            cmd += ["--set", s]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    good = os.path.join(w, "unchanged")
    shutil.copytree(step2, good)
    v, t = verify(good), resume(good, "unchanged")
    if v.returncode != 0 or t.returncode != 0:
        failures.append(f"the unchanged copy: verify exit {v.returncode}, resume exit "
                        f"{t.returncode}\n{v.stdout}{v.stderr}{t.stdout}{t.stderr}")
    for name, (change, _, file) in cases.items():
        d = os.path.join(w, "manifest_" + name)
        shutil.copytree(step2, d)
        change(d)
        v = verify(d)
        out = v.stdout + v.stderr
        line = next((l for l in out.splitlines() if "manifest" in l), "")
        print(f"{name}, manifest: verify exit {v.returncode}: {line or out.strip()[-300:]}")
        if v.returncode != 1 or file not in line or "nothing" not in line:
            failures.append(f"{name}: verify exit {v.returncode}, expected 1 with the manifest "
                            f"refusing {file} before parsing it:\n{out}")
        if name in ("swapped", "edited_step"):
            t = resume(d, "manifest_" + name)
            if t.returncode != 1 or file not in t.stdout + t.stderr:
                failures.append(f"{name}: resume exit {t.returncode}, expected 1 naming {file}:\n"
                                f"{t.stdout}{t.stderr}")
    for name, (change, want, _) in cases.items():
        d = os.path.join(w, name)
        shutil.copytree(step2, d)
        os.remove(os.path.join(d, "manifest.json"))
        change(d)
        v = verify(d)
        out = v.stdout + v.stderr
        ok_v = v.returncode == 1 and want in out
        t = resume(d, name)
        ok_t = t.returncode == 1 and want in t.stdout + t.stderr
        print(f"{name}: verify exit {v.returncode}, resume exit {t.returncode}: "
              f"{next((l for l in out.splitlines() if want in l), out.strip()[-300:])}")
        if not ok_v:
            failures.append(f"{name}: verify exit {v.returncode}, expected 1 with {want!r}:\n{out}")
        if not ok_t:
            failures.append(f"{name}: resume exit {t.returncode}, expected 1 with {want!r}:\n"
                            f"{t.stdout}{t.stderr}")
    d = os.path.join(w, "huge_layers")
    shutil.copytree(step2, d)
    os.remove(os.path.join(d, "manifest.json"))
    huge_layers(d)
    try:
        v = subprocess.run([args.llmtrain, "checkpoint", "verify", d], capture_output=True,
                           text=True, env=env, timeout=60)
        out = v.stdout + v.stderr
        print(f"huge_layers: verify exit {v.returncode}: {out.strip()[-300:]}")
        if v.returncode != 1 or "n_layers = 1000000000, but index.h5 holds" not in out:
            failures.append(f"huge_layers: verify exit {v.returncode}, expected 1 naming both "
                            f"counts:\n{out}")
    except subprocess.TimeoutExpired:
        failures.append("huge_layers: verify still running after 60 s")
    finish(failures)


if __name__ == "__main__":
    main()
