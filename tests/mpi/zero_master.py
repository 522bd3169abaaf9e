#!/usr/bin/python3
"""ZeRO's fp32 master weights in 16-bit precision (zero.h): stages 1 and 2 keep only their rows
(the model's full weights are the compute copy), as stage 3 does, so at one micro-batch per rank
(no accumulation: every stage sums the same two gradients in the same order) stages 1, 2 and 3
must train bitwise alike in bf16 and in fp16 (whose loss scaler skips steps): every step's loss
and grad_norm, and the final master weights (--dump-final gathers them from the rows). A
checkpoint saved at stage 1 (the master rows) resumes at stage 3, and one saved at stage 3 resumes
at stage 2, with the losses of the run that stayed, bitwise. And the rows are what the memory
says: the params bytes of stage 1 are the 16-bit compute copy plus a half of the fp32 masters
on 2 ranks.
Usage: zero_master.py --llmtrain BIN --mpirun MPIRUN --config C --workdir W"""
import json
import os
import shutil

from harness import finish, parse_args, run, train

RANKS = 2
STOP = 5
COMMON = ["train.threads=1", "log.progress=false", "parallel.dp=2", "train.micro_batch_size=4",
          "train.global_batch_size=8"]


def resume(args, out, sets, ckpt):
    """Trains from checkpoint `ckpt` to the end; the steps after STOP."""
    return [m for m in train(args, out, RANKS, sets + [f"checkpoint.load={ckpt}"])
            if m["step"] > STOP]


def main():
    args = parse_args()
    failures = []
    for precision in ["bf16", "fp16"]:
        base = COMMON + [f"train.precision={precision}"]
        if precision == "fp16":  # a scale that overflows first: steps skipped, then updates
            base += ["optimizer.initial_loss_scale=1e7", "optimizer.loss_scale_window=3"]
        runs, finals = {}, {}
        for stage in [1, 2, 3]:
            out = os.path.join(args.workdir, precision, f"zero{stage}")
            runs[stage] = train(args, out, RANKS, base + [f"parallel.zero_stage={stage}"],
                                dump_final=True)
            with open(os.path.join(out, "final", "params.bin"), "rb") as f:
                finals[stage] = f.read()
        for stage in [1, 2]:
            for s, r in zip(runs[stage], runs[3]):
                for key in ["loss", "grad_norm", "skipped"]:
                    if s.get(key) != r.get(key):
                        failures.append(f"{precision} zero{stage} step {s['step']} {key}: "
                                        f"{s.get(key)!r} vs zero3 {r.get(key)!r}")
            if len(runs[stage]) != len(runs[3]) or finals[stage] != finals[3]:
                failures.append(f"{precision} zero{stage}: the final master weights differ from "
                                f"zero3's")
        skipped = sum(1 for m in runs[3] if m.get("skipped"))
        if precision == "fp16" and not 0 < skipped < len(runs[3]) - 2:
            failures.append(f"fp16: {skipped} of {len(runs[3])} steps skipped; the test needs both")
        print(f"{precision}: zero1, zero2, zero3 bitwise equal over {len(runs[3])} steps "
              f"({skipped} skipped by the loss scaler)")

        # Checkpoints of the master rows across stages.
        for a, b in [(1, 3), (3, 2)]:
            ckpt = os.path.join(args.workdir, precision, f"ckpt_zero{a}")
            shutil.rmtree(ckpt, ignore_errors=True)  # an earlier test run's checkpoints
            shutil.rmtree(os.path.join(args.workdir, precision, f"first_zero{a}"),
                          ignore_errors=True)
            cmd_sets = base + [f"parallel.zero_stage={a}", f"checkpoint.dir={ckpt}",
                               "checkpoint.interval=1"]
            first = os.path.join(args.workdir, precision, f"first_zero{a}")
            cmd = [args.mpirun, "--oversubscribe", "-np", str(RANKS), args.llmtrain, "train",
                   "--config", args.config, "-q", "--stop-after-steps", str(STOP)]
            for s in cmd_sets + [f"train.run_dir={first}"]:
                cmd += ["--set", s]
            run(cmd)
            moved = resume(args, os.path.join(args.workdir, precision, f"zero{a}_to_zero{b}"),
                           base + [f"parallel.zero_stage={b}"], ckpt)
            stayed = [m for m in runs[a] if m["step"] > STOP]
            if [(m["loss"], m["grad_norm"]) for m in moved] != \
                    [(m["loss"], m["grad_norm"]) for m in stayed]:
                failures.append(f"{precision}: saved at zero{a}, resumed at zero{b}: steps "
                                f"{[m['step'] for m in moved]} differ from the run that stayed")
            print(f"{precision}: zero{a} -> zero{b} resumed bitwise over {len(moved)} steps")

        # The params bytes: stage 1 holds the compute copy whole (2 bytes a parameter) and its
        # half of the fp32 masters (4 bytes).
        def params_peak(stage):
            return max(m["peak_bytes"]["params"] for m in runs[stage])
        ddp = train(args, os.path.join(args.workdir, precision, "ddp"), RANKS,
                    base + ["parallel.zero_stage=0"])
        n = max(m["peak_bytes"]["params"] for m in ddp) / 6  # DDP: masters 4 + compute copy 2
        p1 = params_peak(1)
        if not 4 * n - 4096 <= p1 <= 4 * n + 4096 * 64:
            failures.append(f"{precision}: zero1 params peak {p1} B, expected the compute copy "
                            f"{2 * n:.0f} B + half the masters {2 * n:.0f} B (padded)")
        print(f"{precision}: params bytes DDP {6 * n:.0f}, zero1 {p1}, zero3 {params_peak(3)}")
    finish(failures)


if __name__ == "__main__":
    main()
