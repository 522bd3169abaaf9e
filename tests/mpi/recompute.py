#!/usr/bin/python3
"""Activation recompute never changes a bit: at one layout, train config C for its train.steps
with train.recompute = "none", "selective" (the attention core), "selective" of the norms and the
activation (train.recompute_modules = ["layernorm", "act"]: their outputs recomputed for the
weight gradients, also in a zero-bubble schedule's deferred weight half) and "full" (and "full"
on the first layer only, train.recompute_layers = 1), in fp32 and bf16, with dropout 0.1 and a
validation pass every 5 steps (with routed experts the third mode reruns theirs too,
"moe_act"; with latent attention also its up projections and the core, "mla_up_proj" and
"core_attn"), and require every step's loss, grad_norm and val_loss and the
final parameters (--dump-final) to be bitwise those of "none". Also checks that recompute lowers
the peak activation bytes (selective < none, full < selective, norms and activation < none); the
exact bytes per layer are
tests/unit/model/test_recompute.cpp's. (Recomputing one layer of two saves nothing: the replay
buffer is one layer's worth, so recompute_layers pays off from 2 layers on.)

Layouts: single (one rank), tp2 and tp2-sp (a replay repeats the forward's collectives),
dp2-zero3 (a replay after ZeRO-3's gather), pp2-1f1b, pp2-interleaved (2 chunks per rank,
4 layers), pp4-zb-h1 (4 layers; the weight half replays when the buffer was reused),
pp2-zb-h1-tp2-sp, pp2-zb-v, pp2-dualpipev and, for mixture-of-experts configs, ep2-pp2-zb-h1,
ep2-pp2-zb-v and ep2-pp2-dualpipev.

Under tp without sequence parallelism, full recompute also runs with its saved inputs split over
tp (train.distribute_saved_activations: "full-dist", and "full-first-dist" under pp, where a
stage sends 1/tp of its output and the next gathers it): bitwise "none" as well, at tp2 (one
stage: the embedding's output split, the last layer's set kept for its backward),
pp2-interleaved-tp2 (every chunk's input received as a part), pp2-zb-h1-tp2 (the weight half
gathers and replays again) and pp2-zb-v-tp2 (the V's turn hands the part over within the rank).
Their activation bytes are plan_memory.py's to check."""
import os
import tomllib

from harness import finish, parse_args, train

LAYOUTS = {
    "single": (1, []),
    "tp2": (2, ["parallel.tp=2"]),
    "tp2-sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "dp2-zero3": (2, ["parallel.zero_stage=3"]),
    "pp2-1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"]),
    "pp2-interleaved": (2, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                            "parallel.virtual_stages=2", "model.n_layers=4"]),
    "pp4-zb-h1": (4, ["parallel.pp=4", "parallel.pp_schedule=zb-h1", "model.n_layers=4"]),
    "pp2-zb-h1-tp2-sp": (4, ["parallel.pp=2", "parallel.pp_schedule=zb-h1", "parallel.tp=2",
                             "parallel.sequence_parallel=true"]),
    "pp2-interleaved-tp2": (4, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                "parallel.virtual_stages=2", "model.n_layers=4", "parallel.tp=2"]),
    "pp2-zb-h1-tp2": (4, ["parallel.pp=2", "parallel.pp_schedule=zb-h1", "parallel.tp=2",
                          "model.n_layers=4"]),
    # ZB-V: two chunks per rank (the weight half replays when the other chunk reused the buffer).
    "pp2-zb-v": (2, ["parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2",
                     "model.n_layers=4"]),
    "pp2-zb-v-tp2": (4, ["parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2",
                         "parallel.tp=2", "model.n_layers=4"]),
    "ep2-pp2-zb-v": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-v",
                         "parallel.virtual_stages=2"]),
    # DualPipeV: whole and split backwards of one chunk alternate (a replay for the whole one, the
    # weight half's when the buffer was reused); it needs 2*pp-1 micro-batches (ep2: 4 of 1).
    "pp2-dualpipev": (2, ["parallel.pp=2", "parallel.pp_schedule=dualpipev",
                          "parallel.virtual_stages=2", "model.n_layers=4"]),
    "ep2-pp2-dualpipev": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=dualpipev",
                              "parallel.virtual_stages=2", "train.micro_batch_size=1"]),
    # Expert parallelism (MoE configs): a replay returns the experts' outputs of its micro-batch.
    "ep2-pp2-zb-h1": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.pp_schedule=zb-h1"]),
    # Context parallelism under MoE: the replay sums the chunks' expert counts over cp again.
    # Latent attention's cp ring moves the kv latent: a replay or the core's recompute runs the
    # ring (and its expansions) again.
    "cp2-tp2-sp": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"]),
    "cp2-ulysses-tp2-sp": (4, ["parallel.cp=2", "parallel.cp_impl=ulysses", "parallel.tp=2",
                               "parallel.sequence_parallel=true"]),
    "cp4-hybrid": (4, ["parallel.cp=4", "parallel.cp_impl=hybrid", "parallel.cp_ulysses=2"]),
    "cp2-ep2-pp2-zb-h1": (4, ["parallel.cp=2", "parallel.ep=2", "parallel.pp=2",
                              "parallel.pp_schedule=zb-h1"]),
}
MODES = [("none", []), ("selective", []),
         ("selective-norm-act", ['train.recompute_modules=["layernorm", "act"]']), ("full", []),
         ("full-first", ["train.recompute_layers=1"])]
DIST = ["train.distribute_saved_activations=true"]
COMMON = ["train.threads=1", "log.progress=false", "model.dropout=0.1", "train.eval_interval=5",
          "train.eval_iters=2"]


def train_run(args, out, ranks, sets):
    steps = train(args, out, ranks, COMMON + sets, dump_final=True)
    with open(os.path.join(out, "final", "params.bin"), "rb") as f:
        return steps, f.read()


def main():
    args = parse_args(lambda ap: ap.add_argument("--layout", required=True, choices=sorted(LAYOUTS)))
    ranks, sets = LAYOUTS[args.layout]
    modes = MODES
    # The third mode also reruns what the model has of the routed experts' activation and latent
    # attention's up projections (with the core, recomputed from the rebuilt queries and keys).
    with open(args.config, "rb") as f:
        model = tomllib.load(f)["model"]
    listed = ["layernorm", "act"]
    if model.get("moe", {}).get("num_experts", 0) > 0:
        listed.append("moe_act")
    if model.get("attention") == "mla" and model.get("mla", {}).get("q_lora_rank", 0) > 0:
        listed = ["core_attn"] + listed + ["mla_up_proj"]
    modes = [(m, ['train.recompute_modules=[' + ", ".join(f'"{x}"' for x in listed) + ']']
              if m == "selective-norm-act" else extra) for m, extra in modes]
    if "parallel.tp=2" in sets and "parallel.sequence_parallel=true" not in sets:
        modes = modes + [("full-dist", DIST)]
        if "parallel.pp=2" in sets:
            modes.append(("full-first-dist", DIST + ["train.recompute_layers=1"]))
    failures = []
    for precision in ["fp32", "bf16"]:
        runs = {}
        for mode, extra in modes:
            out = os.path.join(args.workdir, args.layout, precision, mode)
            recompute = mode.split("-")[0]
            runs[mode] = train_run(args, out, ranks, sets + extra + [
                f"train.precision={precision}", f"train.recompute={recompute}"])
        ref_steps, ref_params = runs["none"]
        peaks = {}
        for mode, (steps, params) in runs.items():
            peaks[mode] = max(s["peak_bytes"]["activations"] for s in steps)
            if len(steps) != len(ref_steps):
                failures.append(f"{precision} {mode}: {len(steps)} steps vs {len(ref_steps)}")
            for s, r in zip(steps, ref_steps):
                for key in ["loss", "grad_norm", "val_loss", "mtp_loss"]:
                    if s.get(key) != r.get(key):
                        failures.append(f"{precision} {mode} step {s['step']} {key}: "
                                        f"{s.get(key)!r} vs none {r.get(key)!r}")
            if params != ref_params:
                failures.append(f"{precision} {mode}: final parameters differ from none")
        print(f"{os.path.basename(args.config)} {args.layout} {precision}: {len(ref_steps)} steps "
              f"bitwise equal; peak activation bytes " +
              ", ".join(f"{m} {peaks[m]}" for m in peaks))
        if not peaks["full"] < peaks["selective"] < peaks["none"]:
            failures.append(f"{precision}: peak activations not none > selective > full: {peaks}")
        if not peaks["selective-norm-act"] < peaks["none"]:
            failures.append(f"{precision}: norms and activation recomputed, peak activations not "
                            f"below none: {peaks}")
    finish(failures)


if __name__ == "__main__":
    main()
