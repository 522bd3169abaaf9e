#!/usr/bin/python3
"""Activation recompute never changes a bit: at one layout, train config C for its train.steps
with train.recompute = "none", "selective" and "full" (and "full" on the first layer only,
train.recompute_layers = 1), in fp32 and bf16, with dropout 0.1, and require every step's loss
and grad_norm and the final parameters (--dump-final) to be bitwise those of "none". Also checks
that recompute lowers the peak activation bytes (selective < none, full < selective); the exact
bytes per layer are tests/unit/model/test_recompute.cpp's. (Recomputing one layer of two saves
less than the one-layer replay buffer it needs: recompute_layers pays off from 2 layers on.)

Layouts: single (one rank), tp2-sp, dp2-zero3, pp2-1f1b, pp4-zb-h1 (4 layers)."""
import os

from harness import finish, parse_args, train

LAYOUTS = {
    "single": (1, []),
    "tp2-sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "dp2-zero3": (2, ["parallel.zero_stage=3"]),
    "pp2-1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"]),
    "pp4-zb-h1": (4, ["parallel.pp=4", "parallel.pp_schedule=zb-h1", "model.n_layers=4"]),
}
MODES = [("none", []), ("selective", []), ("full", []), ("full-first", ["train.recompute_layers=1"])]
COMMON = ["train.threads=1", "log.progress=false", "model.dropout=0.1"]


def train_run(args, out, ranks, sets):
    steps = train(args, out, ranks, COMMON + sets, dump_final=True)
    with open(os.path.join(out, "final", "params.bin"), "rb") as f:
        return steps, f.read()


def main():
    args = parse_args(lambda ap: ap.add_argument("--layout", required=True, choices=sorted(LAYOUTS)))
    ranks, sets = LAYOUTS[args.layout]
    failures = []
    for precision in ["fp32", "bf16"]:
        runs = {}
        for mode, extra in MODES:
            out = os.path.join(args.workdir, args.layout, precision, mode)
            recompute = "full" if mode == "full-first" else mode
            runs[mode] = train_run(args, out, ranks, sets + extra + [
                f"train.precision={precision}", f"train.recompute={recompute}"])
        ref_steps, ref_params = runs["none"]
        peaks = {}
        for mode, (steps, params) in runs.items():
            peaks[mode] = max(s["peak_bytes"]["activations"] for s in steps)
            if len(steps) != len(ref_steps):
                failures.append(f"{precision} {mode}: {len(steps)} steps vs {len(ref_steps)}")
            for s, r in zip(steps, ref_steps):
                for key in ["loss", "grad_norm"]:
                    if s[key] != r[key]:
                        failures.append(f"{precision} {mode} step {s['step']} {key}: {s[key]!r} "
                                        f"vs none {r[key]!r}")
            if params != ref_params:
                failures.append(f"{precision} {mode}: final parameters differ from none")
        print(f"{os.path.basename(args.config)} {args.layout} {precision}: {len(ref_steps)} steps "
              f"bitwise equal; peak activation bytes " +
              ", ".join(f"{m} {peaks[m]}" for m in peaks))
        if not peaks["full"] < peaks["selective"] < peaks["none"]:
            failures.append(f"{precision}: peak activations not none > selective > full: {peaks}")
    finish(failures)


if __name__ == "__main__":
    main()
