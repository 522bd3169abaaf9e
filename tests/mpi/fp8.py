#!/usr/bin/python3
"""FP8 GEMM inputs (train.fp8, docs/model.md "FP8 GEMM inputs") on the tiny config in bf16, for
"blockwise" (tiles of 16, so that every tp rank's q, k and v rows, fc1 rows and proj/fc2 columns
are whole tiles of the single rank's) and "tensorwise"; on the dense configs and the MoE one
(its routed experts' grouped GEMMs too) and latent attention's (tiles of 4; tp with sp only):
- drift: the largest per-step loss difference to the bf16 run without FP8 over STEPS steps (one
  rank), beside the micro-batch-size noise (the bf16 run against the same batch split into 8, 2
  and 1 micro-batches); it must be larger than that noise (FP8 did change the GEMMs) and at most
  DRIFT_BOUND relative to the loss;
- layouts: DDP, ZeRO-1 and 3, tp2, tp2-sp and pp2 (1F1B and ZB-H1) against the single rank with
  the same recipe, at fixed weights (optimizer.lr = 1e-30, as precision_tp.py: every step's
  gradient is taken at the same weights, so the comparison measures the gradient, not two
  trajectories apart): the median over the steps of the relative grad_norm difference within
  LAYOUT_BOUND. These layouts quantise the same tiles as one rank; what differs is fp32 summation
  order, and the odd value it moves across an FP8 rounding boundary (one FP8 step is 2^-4
  relative). Context parallelism is left out: a cp rank's weight-gradient tiles run down its own
  tokens and a tensorwise amax covers its own part of the sequence, so cp changes the
  quantisation itself (docs/model.md);
- control: tiles of 64 straddle a Llama tp rank's q, k and v rows (32, 16, 16) and cover two
  ranks' attention output columns (32 each), so tp2 then quantises other tiles than one rank:
  its difference must exceed CONTROL_FACTOR x LAYOUT_BOUND; latent attention's with tiles of 16
  across its tp2-sp shards must exceed LAYOUT_BOUND.
Usage: fp8.py --llmtrain BIN --mpirun MPIRUN --config C --workdir W"""
import os
import statistics

from harness import finish, parse_args, split_noise, train

STEPS = 12
COMMON = ["train.threads=1", "log.progress=false", f"train.steps={STEPS}",
          "train.precision=bf16", "train.global_batch_size=8", "train.micro_batch_size=2"]
FIXED = ["optimizer.lr=1e-30", "optimizer.min_lr=0"]
DRIFT_BOUND = 0.01
LAYOUT_BOUND = 3e-5
CONTROL_FACTOR = 5
LAYOUTS = {
    "ddp-dp2": (2, ["parallel.dp=2"]),
    "zero1-dp2": (2, ["parallel.dp=2", "parallel.zero_stage=1"]),
    "zero3-dp2": (2, ["parallel.dp=2", "parallel.zero_stage=3"]),
    "tp2": (2, ["parallel.tp=2"]),
    "tp2-sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "pp2": (2, ["parallel.pp=2"]),
    "pp2-zb-h1": (2, ["parallel.pp=2", "parallel.pp_schedule=zb-h1"]),
}
# The MoE config (routed experts' grouped GEMMs quantised run by run: an expert's rows of one
# micro-batch, on one rank or, under ep, received from one peer). MoE under tp routes each tp
# rank's rows, so its experts' weight-gradient tiles cover those rows (as cp's): left out.
MOE_LAYOUTS = {
    "ddp-dp2": (2, ["parallel.dp=2"]),
    "zero3-dp2": (2, ["parallel.dp=2", "parallel.zero_stage=3"]),
    "ep2": (2, ["parallel.ep=2"]),
    "ep2-zero1-dp4": (4, ["parallel.ep=2", "parallel.zero_stage=1"]),
    "ep2-pp2-zb-h1": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-h1"]),
    "pp2": (2, ["parallel.pp=2"]),
}
# Latent attention (configs/mla-tiny.toml; tp needs sp): its up projections' rows per tp rank
# (2 heads of 12 query or 14 key/value rows) and proj's columns (2 x 6) are whole tiles of 4.
MLA_LAYOUTS = {k: v for k, v in LAYOUTS.items() if k != "tp2"}
MLA_BLOCK = 4


def losses(runs):
    return [m["loss"] for m in runs]


def grad_error(a, b):
    """The median over the steps of |grad_norm(a) / grad_norm(b) - 1| (inf if a run is short)."""
    if len(a) != STEPS or len(b) != STEPS:
        return float("inf")
    return statistics.median(abs(x["grad_norm"] / y["grad_norm"] - 1) for x, y in zip(a, b))


def main():
    args = parse_args()
    w = args.workdir
    failures = []
    bf16 = train(args, os.path.join(w, "bf16"), 1, COMMON)
    noise = split_noise(args, w, "bf16", COMMON, bf16)
    llama = "llama" in os.path.basename(args.config)
    mla = "mla" in os.path.basename(args.config)
    layouts = (MOE_LAYOUTS if "moe" in os.path.basename(args.config)
               else MLA_LAYOUTS if mla else LAYOUTS)
    block = MLA_BLOCK if mla else 16
    for scaling in ("blockwise", "tensorwise"):
        recipe = [f"train.fp8={scaling}"] + ([f"train.fp8_block={block}"]
                                              if scaling == "blockwise" else [])
        one = train(args, os.path.join(w, scaling), 1, COMMON + recipe)
        drift = max(abs(a - b) for a, b in zip(losses(bf16), losses(one)))
        rel = max(abs(a / b - 1) for a, b in zip(losses(one), losses(bf16)))
        print(f"{scaling}: drift against bf16 over {STEPS} steps: max |loss difference| "
              f"{drift:.3g} ({rel:.2e} relative); micro-batch-size noise {noise:.3g} "
              f"({drift / noise:.1f}x)")
        if len(one) != STEPS or not noise < drift or rel > DRIFT_BOUND:
            failures.append(f"{scaling}: drift {drift:.3g} ({rel:.2e} relative) against the "
                            f"noise {noise:.3g} and the bound {DRIFT_BOUND} relative")
        fixed = train(args, os.path.join(w, f"{scaling}-fixed"), 1, COMMON + recipe + FIXED)
        for name, (ranks, sets) in layouts.items():
            got = train(args, os.path.join(w, f"{scaling}-{name}"), ranks,
                        COMMON + recipe + FIXED + sets)
            err = grad_error(got, fixed)
            print(f"{scaling} {name}: median relative grad_norm difference to one rank {err:.2e}")
            if not err <= LAYOUT_BOUND:
                failures.append(f"{scaling} {name}: grad_norm differs from the single rank by "
                                f"{err:.2e} relative (median)")
        if (llama or mla) and scaling == "blockwise":
            # Latent attention: tiles of 16 straddle a tp rank's 24 query and 28 key/value rows
            # (only its up projections and proj take FP8 inputs, so the effect is smaller: 4.7e-5
            # against 7.8e-7 aligned; it must exceed the layouts' bound itself).
            tile = 64 if llama else 16
            straddle = ["train.fp8=blockwise", f"train.fp8_block={tile}"] + FIXED
            tp2 = ["parallel.tp=2"] + ([] if llama else ["parallel.sequence_parallel=true"])
            ref = train(args, os.path.join(w, "straddle"), 1, COMMON + straddle)
            got = train(args, os.path.join(w, "straddle-tp2"), 2, COMMON + straddle + tp2)
            err = grad_error(got, ref)
            print(f"control: tiles of {tile} across the tp shards: {err:.2e}")
            if not err > (CONTROL_FACTOR if llama else 1) * LAYOUT_BOUND:
                failures.append(f"control: tp2 with tiles across its shards differs by only "
                                f"{err:.2e}: the layout check cannot tell")
    finish(failures)


if __name__ == "__main__":
    main()
