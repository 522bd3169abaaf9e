#!/usr/bin/python3
"""Fine-tuning from a checkpoint (checkpoint.init_from) at another layout.

For a pair A:B of parity.py's layouts (plus "single"):
  1. train at A with a checkpoint after step 5 (--stop-after-steps);
  2. fine-tune from it on one rank and at B (init_from, with dropout switched on, which fine-tuning
     may change): both must start at step 1 on the fresh schedule (the first step's lr is a fresh
     run's), below a fresh run's first loss, and agree step by step within 1e-5 relative (loss and
     grad norm);
  3. init_from with another model (d_model doubled) is refused (exit 2) naming model.d_model;
  4. resuming the checkpoint with the other optimizer (optimizer.type adamw <-> muon) is refused
     (exit 2) with one message naming optimizer.type, and init_from under it trains.
Prints the worst relative differences."""
import os
import shutil
import subprocess

from checkpoint_reshard import LAYOUTS, STOP, launch, train, worst_differences
from harness import finish, parse_args


def main():
    args = parse_args(lambda ap: ap.add_argument("--pair", required=True))
    a, b = args.pair.split(":")
    base = sorted(set(LAYOUTS[a][2] + LAYOUTS[b][2])) + args.sets
    w = os.path.join(args.workdir, "finetune_" + args.pair.replace(":", "_to_"))
    shutil.rmtree(w, ignore_errors=True)  # an earlier test run's checkpoints would be refused
    os.makedirs(w, exist_ok=True)
    ckpt = os.path.join(w, "ckpt_a")
    failures = []

    fresh = train(args, os.path.join(w, "fresh_a"), a, base, ["--stop-after-steps", str(STOP)],
                  [f"checkpoint.dir={ckpt}"])
    tune = [f"checkpoint.init_from={ckpt}", "model.dropout=0.1"]
    one = train(args, os.path.join(w, "tune_single"), "single", base, (), tune)
    at_b = train(args, os.path.join(w, "tune_b"), b, base, (), tune)
    if [m["step"] for m in one] != list(range(1, len(one) + 1)) or len(at_b) != len(one):
        failures.append(f"steps {[m['step'] for m in one]} and {[m['step'] for m in at_b]}")
    if one[0]["lr"] != fresh[0]["lr"]:
        failures.append(f"first lr {one[0]['lr']} is not a fresh schedule's {fresh[0]['lr']}")
    if not one[0]["loss"] < fresh[0]["loss"] - 0.05:
        failures.append(f"first loss {one[0]['loss']} is not below a fresh run's "
                        f"{fresh[0]['loss']}: the weights were not loaded")
    worst = worst_differences(zip(at_b, one), failures,
                              lambda key, m, s: f"{m[key]!r} at {b} vs {s[key]!r} on one rank")

    # Another model is refused before anything is allocated.
    ranks, sets, _ = LAYOUTS["single"]
    cmd = [args.llmtrain, "train", "--config", args.config, "-q", "--set",
           f"train.run_dir={os.path.join(w, 'other_model')}", "--set", tune[0], "--set",
           "model.d_model=32", "--set", "model.n_heads=2"]
    proc = subprocess.run(launch(args, ranks, cmd), capture_output=True, text=True)
    if proc.returncode != 2 or "model.d_model" not in proc.stderr:
        failures.append(f"init_from with another d_model: exit {proc.returncode}, {proc.stderr!r}")

    # The other optimizer: no resume (its states differ), but its weights start a run.
    other = "adamw" if "optimizer.type=muon" in args.sets else "muon"
    cmd = [args.llmtrain, "train", "--config", args.config, "-q"]
    for s in base + [f"train.run_dir={os.path.join(w, 'other_optimizer')}",
                     f"checkpoint.load={ckpt}", f"optimizer.type={other}"]:
        cmd += ["--set", s]  # (the later of two sets of a key wins)
    proc = subprocess.run(launch(args, ranks, cmd), capture_output=True, text=True)
    if (proc.returncode != 2 or f'optimizer.type = "{other}"' not in proc.stderr
            or proc.stderr.count("\n") > 3):
        failures.append(f"resume under optimizer.type={other}: exit {proc.returncode}, "
                        f"{proc.stderr!r}")
    tuned = train(args, os.path.join(w, "tune_other_optimizer"), "single", base, (),
                  tune + [f"optimizer.type={other}"])
    if not tuned[0]["loss"] < fresh[0]["loss"] - 0.05:
        failures.append(f"init_from under {other}: first loss {tuned[0]['loss']} is not below a "
                        f"fresh run's {fresh[0]['loss']}")

    print(f"{os.path.basename(args.config)} saved at {a}, fine-tuned at {b} and on one rank: "
          f"{len(one)} steps, max rel loss {worst['loss']:.2e}, grad_norm {worst['grad_norm']:.2e}; "
          f"first loss {one[0]['loss']:.4f} vs fresh {fresh[0]['loss']:.4f}")
    finish(failures)


if __name__ == "__main__":
    main()
