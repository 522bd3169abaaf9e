#!/usr/bin/python3
"""Checkpoint resharding (issue: save in layout A, load in layout B).

For a pair A:B of parity.py's layouts (plus "single", one rank):
  1. train at A for train.steps (the run that stays at A);
  2. train at A again with background saves every step, stopping after step 5
     (--stop-after-steps);
  3. resume that checkpoint at B and train to the end: the losses and grad norms of steps 6.. must
     match run 1 within 1e-5 relative;
  4. `checkpoint reshard` the step-5 checkpoint to B and back to A: every dataset of every rank
     file must be bitwise identical to the original, and the index must read the same tensors;
  5. resume the resharded B checkpoint at B: bitwise the same losses as step 3.
Prints the worst relative differences."""
import json
import os
import shutil

import h5py
import numpy as np

from harness import finish, parse_args, run
from parity import COMMON, LAYOUTS

LAYOUTS = dict(LAYOUTS, single=(1, [], []))
STOP = 5


def launch(args, ranks, cmd):
    return ([args.mpirun, "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []) + cmd


def train(args, out, layout, base, extra_args=(), extra_sets=()):
    ranks, sets, _ = LAYOUTS[layout]
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.llmtrain, "train", "--config", args.config, "-q", *extra_args]
    for s in COMMON + sets + base + list(extra_sets) + [f"train.run_dir={out}"]:
        cmd += ["--set", s]
    run(launch(args, ranks, cmd))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def worst_differences(pairs, failures, what, bound=1e-5):
    """The largest relative differences of loss and grad norm over (got, ref) metric rows; each
    step past `bound` appends to failures, described by what(key, got, ref)."""
    worst = {"loss": 0.0, "grad_norm": 0.0}
    for m, s in pairs:
        for key in worst:
            d = abs(m[key] - s[key]) / abs(s[key])
            worst[key] = max(worst[key], d)
            if d > bound:
                failures.append(f"step {m['step']} {key}: {what(key, m, s)} (relative {d:.2e} > "
                                f"{bound:g})")
    return worst


def reshard(args, src, dst, layout, base):
    ranks, sets, _ = LAYOUTS[layout]
    shutil.rmtree(dst, ignore_errors=True)
    # The stored config keeps the source layout's keys: reset them before applying the target's.
    cmd = [args.llmtrain, "checkpoint", "reshard", src, dst, "--world", str(ranks)]
    for s in ["parallel.tp=1", "parallel.cp=1", "parallel.cp_impl=ring", "parallel.dp=-1",
              "parallel.pp=1", "parallel.pp_schedule=1f1b", "parallel.ep=1",
              "parallel.virtual_stages=1", "parallel.pp_layers=[]", "parallel.pp_max_deferred=-1",
              "parallel.zero_stage=0",
              "parallel.zero_shard_group=0", "parallel.zero_quantized_weights=false",
              "parallel.zero_quantized_gradients=false",
              "parallel.zero_quant_block=256", "parallel.zero_hierarchical_partition=0",
              "parallel.sequence_parallel=false", "train.micro_batch_size=2"] + sets + base:
        cmd += ["--set", s]
    return run(cmd)


def datasets(path):
    """{name: raw bytes} of every dataset in an HDF5 file."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()].tobytes())
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def main():
    args = parse_args(lambda ap: ap.add_argument("--pair", required=True))
    a, b = args.pair.split(":")
    base = sorted(set(LAYOUTS[a][2] + LAYOUTS[b][2])) + args.sets
    w = os.path.join(args.workdir, args.pair.replace(":", "_to_"))
    shutil.rmtree(w, ignore_errors=True)  # an earlier test run's checkpoints would be refused
    os.makedirs(w, exist_ok=True)
    ckpt = os.path.join(w, "ckpt_a")
    failures = []

    stay = train(args, os.path.join(w, "stay_a"), a, base)
    # Saves every step in the background (checkpoint.async): each completes at a later step's
    # collective poll, the last before the run ends.
    train(args, os.path.join(w, "first_a"), a, base, ["--stop-after-steps", str(STOP)],
          [f"checkpoint.dir={ckpt}", "checkpoint.interval=1", "checkpoint.async=true"])
    moved = train(args, os.path.join(w, "then_b"), b, base, (), [f"checkpoint.load={ckpt}"])
    moved = [m for m in moved if m["step"] > STOP]
    if [m["step"] for m in moved] != [s["step"] for s in stay if s["step"] > STOP]:
        failures.append(f"resumed steps {[m['step'] for m in moved]}")
    worst = worst_differences(
        [(m, stay[m["step"] - 1]) for m in moved], failures,
        lambda key, m, s: f"{m[key]!r} at {b} after {a} vs {s[key]!r} staying at {a}")

    # reshard A -> B -> A: bitwise the same files.
    step_dir = os.path.join(ckpt, f"step_{STOP:08d}")
    rb, ra = os.path.join(w, "resharded_b"), os.path.join(w, "resharded_a")
    reshard(args, step_dir, rb, b, base)
    reshard(args, rb, ra, a, base)
    ranks_a = LAYOUTS[a][0]
    for r in range(ranks_a):
        name = f"rank_{r:05d}.h5"
        orig, back = datasets(os.path.join(step_dir, name)), datasets(os.path.join(ra, name))
        if orig.keys() != back.keys():
            failures.append(f"{name}: datasets {sorted(orig.keys() ^ back.keys())} differ")
        diff = [k for k in orig if k in back and orig[k] != back[k]]
        if diff:
            failures.append(f"{name}: {len(diff)} datasets differ after A->B->A, e.g. {diff[0]}")
    with h5py.File(os.path.join(step_dir, "index.h5"), "r") as f0, \
            h5py.File(os.path.join(rb, "index.h5"), "r") as f1:
        names = []
        f0.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in names:
            if not np.array_equal(f0[n][()], f1[n][()]):
                failures.append(f"index tensor {n} differs between A and resharded B")

    # The resharded checkpoint resumes at B exactly as the original did.
    again = train(args, os.path.join(w, "then_b_resharded"), b, base, (),
                  [f"checkpoint.load={rb}"])
    again = [m for m in again if m["step"] > STOP]
    if [m["loss"] for m in again] != [m["loss"] for m in moved]:
        failures.append("resuming the resharded checkpoint gave other losses than resuming "
                        "the original")

    print(f"{os.path.basename(args.config)} {a} -> {b}: {len(moved)} steps after resume, max rel "
          f"loss {worst['loss']:.2e}, grad_norm {worst['grad_norm']:.2e}; A->B->A reshard "
          f"bitwise over {ranks_a} rank files")
    finish(failures)


if __name__ == "__main__":
    main()
