#!/usr/bin/python3
"""Tensor/sequence-parallel communication per step against the analytic volume
(docs/parallelism.md), from the tp communicator's counters in metrics.jsonl.

Per micro-batch, with N = micro_batch_size * seq_len tokens, C = d_model, L layers, 4-byte
floats, E = 4 N C bytes, p = tp and f = (p-1)/p (ring volumes, as the communicator counts them):
  tp:      all-reduce   2f * (E (4L + 2) + 4 * 3N)         4L+2 activations, cross-entropy stats
  tp + sp: reduce-scatter f * E (4L + 2); all-gather f * E (6L + 2);
           all-reduce   2f * (4 * 3N + 4 * kC (2L + 1))    cross-entropy, norm gradients
           (k = 2 for layernorm's weight and bias, 1 for rmsnorm's weight)
plus one float all-reduced per step for the gradient norm, times the micro-batches per rank.
Checked within 5% (the counts are exact; the margin is the issue's)."""
import json
import os
import shutil

from harness import finish, parse_args, resolved_config, run

LAYOUTS = {"tp2": (2, False), "tp4": (4, False), "tp2-sp": (2, True), "tp4-sp": (4, True)}
SETS = ["train.steps=2", "train.threads=1", "log.progress=false", "model.n_kv_heads=4"]


def analytic(cfg, p, sp):
    L, C, T = int(cfg["n_layers"]), int(cfg["d_model"]), int(cfg["seq_len"])
    mbs, gbs = int(cfg["micro_batch_size"]), int(cfg["global_batch_size"])
    N, E, f, micro = mbs * T, 4 * mbs * T * C, (p - 1) / p, gbs // mbs
    k = 1 if cfg["norm"].strip('"') == "rmsnorm" else 2
    if not sp:
        return {"all_reduce": micro * 2 * f * (E * (4 * L + 2) + 4 * 3 * N) + 2 * f * 4}
    return {"reduce_scatter": micro * f * E * (4 * L + 2),
            "all_gather": micro * f * E * (6 * L + 2),
            "all_reduce": micro * 2 * f * (4 * 3 * N + 4 * k * C * (2 * L + 1)) + 2 * f * 4}


def main():
    args = parse_args()
    _, cfg = resolved_config(args, SETS)
    sets = []
    for s in SETS:
        sets += ["--set", s]
    failures = []
    for name, (p, sp) in LAYOUTS.items():
        out = os.path.join(args.workdir, name)
        shutil.rmtree(out, ignore_errors=True)
        run([args.mpirun, "--oversubscribe", "-np", str(p), args.llmtrain, "train", "--config",
             args.config, "-q", "--set", f"parallel.tp={p}", "--set",
             f"parallel.sequence_parallel={'true' if sp else 'false'}", "--set",
             f"train.run_dir={out}"] + sets)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            last = [json.loads(line) for line in f][-1]
        got = last["comm_bytes"].get("tp", {})
        want = analytic(cfg, p, sp)
        for kind in sorted(set(got) | set(want)):
            g, w = got.get(kind, 0), want.get(kind, 0)
            d = g / w - 1 if w else float("inf") if g else 0.0
            print(f"{os.path.basename(args.config)} {name} {kind}: {g} bytes/step, analytic "
                  f"{w:.0f} ({d:+.2%})")
            if abs(d) > 0.05:
                failures.append(f"{name} {kind}: {g} vs analytic {w:.0f}")
    finish(failures)


if __name__ == "__main__":
    main()
