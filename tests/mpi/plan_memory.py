#!/usr/bin/python3
"""`llmtrain plan` against what a run allocates: for each layout, the params, grads and optimizer
bytes plan prints for rank 0 equal (within 2%; in practice to the byte) the peaks rank 0's
allocator reports in metrics.jsonl after two steps."""
import re

import harness

LAYOUTS = {  # name: (ranks, sets)
    "single": (1, []),
    "bf16": (1, ["train.precision=bf16"]),
    "dp2": (2, ["parallel.dp=2"]),
    "zero1-dp2": (2, ["parallel.dp=2", "parallel.zero_stage=1"]),
    "zero2-dp2": (2, ["parallel.dp=2", "parallel.zero_stage=2"]),
    "zero3-dp3": (3, ["parallel.dp=3", "parallel.zero_stage=3", "train.global_batch_size=6"]),
    "tp2": (2, ["parallel.tp=2", "parallel.dp=1"]),
    "pp2": (2, ["parallel.pp=2", "parallel.dp=1"]),
    "tp2-dp2-zero3": (4, ["parallel.tp=2", "parallel.dp=2", "parallel.zero_stage=3"]),
    "pp2-dp2-zero1-bf16": (4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero_stage=1",
                               "train.precision=bf16"]),
}


def main():
    args = harness.parse_args()
    failures = []
    for name, (ranks, sets) in LAYOUTS.items():
        sets = sets + ["train.steps=2", "train.micro_batch_size=1"]
        cmd = [args.llmtrain, "plan", "--config", args.config, "--world", str(ranks)]
        for s in sets:
            cmd += ["--set", s]
        out = harness.run(cmd)
        m = re.search(r"rank 0 \(tp 0, pp 0\): params (\d+), grads (\d+), optimizer (\d+)", out)
        if not m:
            failures.append(f"{name}: no rank 0 line in plan:\n{out}")
            continue
        planned = dict(zip(["params", "grads", "optimizer"], map(int, m.groups())))
        peak = harness.train(args, f"{args.workdir}/{name}", ranks, sets)[-1]["peak_bytes"]
        for k, v in planned.items():
            if abs(v - peak[k]) > 0.02 * peak[k]:
                failures.append(f"{name}: {k} planned {v} B, allocated {peak[k]} B")
        print(f"{name}: planned {planned}, allocated "
              f"{ {k: peak[k] for k in planned} }")
    harness.finish(failures)


if __name__ == "__main__":
    main()
