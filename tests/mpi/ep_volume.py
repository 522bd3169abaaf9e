#!/usr/bin/python3
"""Expert parallelism's all-to-all bytes (rank 0's counters, metrics' comm_bytes["ep"]) against
the analytic volume from the routed counts (docs/parallelism.md, "Expert parallelism"). Per MoE
layer and micro-batch, rank 0's forward sends the other ep ranks its per-expert row counts (an
all-to-all of ep x E/ep int32: (ep-1) x E/ep x 4 bytes to others), the rows it routed to their
experts, and the outputs of the rows they routed to its experts; its backward sends the same
rows' gradients the same ways. With R0 the rows rank 0 exchanged in its forward dispatches (sent
plus received, from the dispatch's counts: metrics' moe_ep_rows), per step:

    all_to_all = 2 x R0 x d_model x 4 + (ep - 1) x (E / ep) x 4 x (MoE layers) x micro-batches

exactly, at ep 2 and 4, with capacity dropping (fewer rows) and without. Also: the rows move
(R0 > 0), and without ep there is no ep traffic."""
import tomllib

import harness

LAYOUTS = {  # name: (ranks, sets)
    "ep2": (2, ["parallel.ep=2"]),
    "ep4": (4, ["parallel.ep=4"]),
    "ep2-dp4-capacity": (4, ["parallel.ep=2", "model.moe.capacity_factor=1.0"]),
    "ep4-accum2": (4, ["parallel.ep=4", "train.global_batch_size=16"]),
}


def main():
    args = harness.parse_args()
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    m, moe = cfg["model"], cfg["model"]["moe"]
    C, E, L = m["d_model"], moe["num_experts"], m["n_layers"]
    first, every = moe.get("first_dense_layers", 0), moe.get("every", 1)
    moe_layers = sum(1 for l in range(L) if l >= first and (l - first) % every == 0)
    failures = []
    for name, (ranks, sets) in LAYOUTS.items():
        sets = sets + ["train.steps=3", "log.progress=false", "train.threads=1"]
        steps = harness.train(args, f"{args.workdir}/{name}", ranks, sets)
        if [s["step"] for s in steps] != [1, 2, 3]:
            failures.append(f"{name}: metrics lines for steps {[s['step'] for s in steps]}, "
                            "expected 1..3")
        ep = int([s for s in sets if s.startswith("parallel.ep=")][0].split("=")[1])
        gbs = int(next((s.split("=")[1] for s in sets if s.startswith("train.global_batch_size=")),
                       cfg["train"]["global_batch_size"]))
        micro = gbs // (ranks * cfg["train"]["micro_batch_size"])
        for s in steps:
            got = s["comm_bytes"]["ep"]["all_to_all"]
            rows = s["moe_ep_rows"]
            want = 2 * rows * C * 4 + (ep - 1) * (E // ep) * 4 * moe_layers * micro
            print(f"{name} step {s['step']}: ep all_to_all {got} B, analytic {want} B "
                  f"(rows exchanged {rows}, {moe_layers} MoE layers x {micro} micro-batches)")
            if got != want or rows <= 0:
                failures.append(f"{name} step {s['step']}: counted {got} B, analytic {want} B, "
                                f"rows {rows}")
    plain = harness.train(args, f"{args.workdir}/dp2", 2, ["train.steps=2", "log.progress=false"])
    if len(plain) != 2:
        failures.append(f"dp2: {len(plain)} metrics lines, expected 2")
    elif "ep" in plain[-1].get("comm_bytes", {}):
        failures.append(f"dp2 without ep has ep traffic: {plain[-1]['comm_bytes']}")
    harness.finish(failures)


if __name__ == "__main__":
    main()
