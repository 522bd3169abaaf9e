#!/usr/bin/python3
"""A paper setup (configs/papers) shrunk to this machine (`--shrink`, docs/papers.md) trains under
mpirun with its parallel structure and matches the shrunk config's single-rank run step by step:
relative 1e-5 on the loss, 1e-4 on the grad norm, in fp32 (without FP8 GEMM inputs). Then the
same layout trains in the config's own precision (bf16/fp16, with its train.fp8) and its losses
must be finite (16-bit rounding differs between
layouts; precision_tp.py bounds that). Prints the layout, world size and worst differences."""
import math
import os
import re

from harness import finish, parse_args, run, train

SINGLE = ["parallel.tp=1", "parallel.cp=1", "parallel.cp_impl=ring", "parallel.cp_ulysses=0",
          "parallel.pp=1", "parallel.pp_schedule=1f1b", "parallel.virtual_stages=1",
          "parallel.pp_max_deferred=-1",
          "parallel.dp=-1", "parallel.zero_stage=0", "parallel.zero_shard_group=0",
          "parallel.zero_quantized_weights=false", "parallel.zero_quantized_gradients=false",
          "parallel.zero_quant_block=256",
          "parallel.zero_hierarchical_partition=0", "parallel.ep=1",
          "parallel.sequence_parallel=false",
          "train.distribute_saved_activations=false"]
COMMON = ["train.threads=1", "log.progress=false"]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def main():
    args = parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    shown = run([args.llmtrain, "config", "show", "--shrink", "--config", args.config])
    world = int(re.search(r"^# shrunk \(--shrink\) to world (\d+)", shown, re.M).group(1))
    shrunk = os.path.join(args.workdir, "shrunk.toml")
    with open(shrunk, "w") as f:
        f.write(shown.split("\n# parameters:")[0] + "\n")
    precision = re.search(r'^precision = "(\w+)"', shown, re.M).group(1)
    name = os.path.basename(args.config)
    args.config = shrunk
    fp32 = ["train.precision=fp32", "train.fp8=none"]  # FP8 inputs need a 16-bit run
    ref = train(args, os.path.join(args.workdir, "single"), 1, COMMON + fp32 + SINGLE)
    got = train(args, os.path.join(args.workdir, "layout"), world, COMMON + fp32)
    failures = []
    if len(got) != len(ref):
        failures.append(f"{len(got)} steps at world {world}, {len(ref)} at one rank")
    d_loss = max(rel(g["loss"], r["loss"]) for g, r in zip(got, ref))
    d_norm = max(rel(g["grad_norm"], r["grad_norm"]) for g, r in zip(got, ref))
    if d_loss > 1e-5:
        failures.append(f"loss differs by {d_loss:.2e} (bound 1e-5)")
    if d_norm > 1e-4:
        failures.append(f"grad norm differs by {d_norm:.2e} (bound 1e-4)")
    section = shown.split("\n[parallel]\n")[1].split("\n[")[0]
    layout = re.findall(r"^(tp|cp|cp_impl|pp|pp_schedule|virtual_stages|dp|zero_stage|"
                        r"sequence_parallel) = (\S+)$", section, re.M)
    own = ""
    if precision != "fp32":
        low = train(args, os.path.join(args.workdir, precision), world, COMMON)
        losses = [m["loss"] for m in low]
        own = f"; {precision} losses {', '.join(f'{x:.4f}' for x in losses)}"
        if not all(math.isfinite(x) for x in losses):
            failures.append(f"{precision} losses are not finite: {losses}")
    print(f"{name} world {world} ({' '.join(f'{k} {v}' for k, v in layout)}): "
          f"max rel loss {d_loss:.2e}, grad_norm {d_norm:.2e} in fp32{own}")
    finish(failures)


if __name__ == "__main__":
    main()
