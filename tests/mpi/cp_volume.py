#!/usr/bin/python3
"""Context-parallel communication and memory per step against the analytic figures
(docs/parallelism.md, "Context parallelism"), from the cp communicator's counters and the
allocator's peaks in metrics.jsonl.

Per micro-batch and layer, with B = micro_batch_size, p = cp, Tl = seq_len/p positions per rank,
H/KV query/kv heads, D head dim, 4-byte floats, u the all-to-all group (1 ring, p ulysses,
cp_ulysses hybrid) and r = p/u the ring (fp32; the bf16/fp16 layouts move and keep q/k/v and
the output in 16 bits, analytic()'s v):
  all-to-all  of qkv (Q = 4 B Tl (H+2KV) D) and the output (O = 4 B Tl H D) forward; of qkv and
              dout to heads and dqkv back in backward: (u-1)/u (3Q + 2O) (in 16 bits:
              (u-1)/u ((2v+1)Q + (v+1)O)).
  ring        E = 4 B Tl 2KV D (one rank's K and V; after the all-to-all u*Tl positions of KV/u
              heads, as many bytes). Forward: r-1 exchanges of E; backward: r-1 of the K/V and r
              of the dK/dV accumulators, and under hybrid r-1 more to replay the ring forward.
              send = recv = (3r - 2) E, + (r-1) E under hybrid.
times L layers and gbs/mbs micro-batches; under recompute each replay of a core's forward moves
the forward's share again (analytic()); the gradient all-reduce over dp x cp (here the cp
group) adds 2 (p-1)/p * 4P for P parameters. Checked within 1% (the counts are exact).

Memory: every activation is per position, so the peak `activations` at cp = p is the cp = 1 peak
over p (within 1%: 64-byte alignment of each tensor), but where latent attention's core expands
every block from the payloads (u > 1) each saved qkv keeps its queries and one key head (H + 1
of 3H heads): L B T (2H-1) D 4v bytes less over the p ranks. The cp buffers (`comm`) are
  positions   4 Tl + 4 p Tl  (this rank's, and the ring's table)
  u > 1       2Q + 2Q + 2O + 4 B H Tl  (all-to-all send and receive staging; head-sharded qkv and
              dqkv, Q each; output and dout, O each; lse)
  r > 1       4E + O + 4 B H Tl  (two K/V and two dK/dV buffers, one block's output and lse)
each rounded up to 64 bytes, exactly.

Multi-head latent attention (configs/mla-tiny.toml): heads of D = qk_nope + qk_rope dims (values
zero-padded to D), KV = H; a pure ring moves each position's kv latent and rotated RoPE key
instead of its K/V, P = kv_lora_rank + qk_rope_head_dim values: E = 4 B Tl P, and its buffers are
two payloads and two payload-gradient accumulators (v E and E) plus one block's K/V and its f32
dK/dV (v K and K, K = 4 B Tl 2KV D). Ulysses moves only the queries through the all-to-all
(Q = 4 B Tl H D in its formula), all-gathers the payloads twice (forward; backward again):
all_gather = 2 (u-1) v E', E' = 4 B Tl P, and reduce-scatters their fp32 gradients once:
reduce_scatter = (u-1) E'; its staging holds B Tl H D floats each, and it adds this rank's
payload and its gradient (v E', E'), the group's gathered payloads (u v E') and, without a
ring, their gradients (u E'), and one rank's K/V and dK/dV of its heads (v K/u, K/u). Hybrid
does both, its ring passing a group's payloads (E = u E').

`llmtrain plan` prints the same send/recv/all-to-all bytes per step (its C++ formula,
cp_bytes_per_layer): they must equal the counters exactly.

Load balance is not measured here: test_context_parallel counts the causal (query, key) pairs
per rank, equal under the zigzag split."""
import json
import os
import re
import shutil

from harness import finish, parse_args, resolved_config, run

# name: (cp, impl, all-to-all group, precision, train.recompute)
LAYOUTS = {"cp2-ring": (2, "ring", 1, "fp32", "none"), "cp4-ring": (4, "ring", 1, "fp32", "none"),
           "cp2-ulysses": (2, "ulysses", 2, "fp32", "none"),
           "cp4-ulysses": (4, "ulysses", 4, "fp32", "none"),
           "cp4-hybrid": (4, "hybrid", 2, "fp32", "none"),
           "cp2-ring-bf16": (2, "ring", 1, "bf16", "none"),
           "cp2-ulysses-fp16": (2, "ulysses", 2, "fp16", "none"),
           "cp4-hybrid-bf16": (4, "hybrid", 2, "bf16", "none"),
           "cp2-ring-full": (2, "ring", 1, "fp32", "full"),
           "cp2-ulysses-selective": (2, "ulysses", 2, "fp32", "selective")}
SETS = ["train.steps=2", "train.threads=1", "log.progress=false", "model.n_kv_heads=4"]


def up64(n):
    return (n + 63) // 64 * 64


def analytic(cfg, p, u, params, v, replays):
    """v: bytes of a q/k/v or output value over 4 (1 in fp32, 1/2 in bf16/fp16: they move and
    are kept in 16 bits, their gradients, partial results and the all-to-all staging in fp32;
    a 16-bit ring merges its blocks into one more fp32 output). replays: the cores' forwards a
    micro-batch's backward replays (selective recompute of the core and full recompute: every
    layer but the last, whose forward has just run and left its core or its replay set), each
    moving the forward's share again: the ring's (r-1) v E, the all-to-all's (u-1)/u v (Q + O),
    latent Ulysses' all-gather (u-1) v E."""
    L, C, T = int(cfg["n_layers"]), int(cfg["d_model"]), int(cfg["seq_len"])
    H, KV = int(cfg["n_heads"]), int(cfg["n_kv_heads"]) or int(cfg["n_heads"])
    B, gbs = int(cfg["micro_batch_size"]), int(cfg["global_batch_size"])
    D, Tl, micro, r = C // H, T // p, gbs // B, p // u
    mla = cfg.get("attention") == '"mla"'
    if mla:
        D, KV = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"]), H
    E, Q, O = 4 * B * Tl * 2 * KV * D, 4 * B * Tl * (H + 2 * KV) * D, 4 * B * Tl * H * D
    K = E  # one ring block's K/V (u Tl positions of KV/u heads)
    payload = mla
    El = 4 * B * Tl * (int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"]))  # a rank's payload
    if payload:
        E = u * El  # the ring's block: the payloads of its u ranks' positions
    comm = {"all_reduce": 2 * (p - 1) / p * 4 * params}
    fewer = L * B * T * (2 * H - 1) * D * 4 * v if payload and u > 1 else 0  # activations x p
    buffers = up64(4 * Tl) + up64(4 * p * Tl)
    if u > 1:
        moved = O if payload else Q  # the queries alone, or q/k/v
        comm["all_to_all"] = (micro * L * (u - 1) / u * ((2 * v + 1) * moved + (v + 1) * O) +
                              micro * replays * (u - 1) / u * v * (moved + O))
        buffers += (2 * up64(moved) + up64(Q) + up64(int(v * Q)) + up64(O) + up64(int(v * O)) +
                    up64(4 * B * H * Tl))
        if payload:
            comm["all_gather"] = micro * (2 * L + replays) * (u - 1) * v * El
            comm["reduce_scatter"] = micro * L * (u - 1) * El
            buffers += (up64(int(v * El)) + up64(int(u * v * El)) +
                        (up64(u * El) if r == 1 else 0) + up64(El) + up64(int(v * K / u)) +
                        up64(K // u))
    if r > 1:
        comm["send"] = comm["recv"] = (micro * L * ((2 + (u > 1)) * (r - 1) * v + r) * E +
                                       micro * replays * (r - 1) * v * E)
        buffers += (2 * up64(E) + 2 * up64(int(v * E)) + up64(O) + up64(4 * B * H * Tl) +
                    (up64(O) if v < 1 else 0) + (up64(K) + up64(int(v * K)) if payload else 0))
    return comm, buffers, fewer


def train(args, out, ranks, sets):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.llmtrain, "train", "--config", args.config, "-q", "--set", f"train.run_dir={out}"]
    for s in SETS + sets:
        cmd += ["--set", s]
    run(([args.mpirun, "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []) + cmd)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f][-1]


def main():
    args = parse_args()
    _, cfg = resolved_config(args, SETS)
    failures = []
    single = train(args, os.path.join(args.workdir, "single"), 1, [])
    params = single["peak_bytes"]["params"] // 4
    singles = {("fp32", "none"): single}  # the cp = 1 run of each precision and recompute
    name = os.path.basename(args.config)

    def check(what, got, want, bound):
        d = got / want - 1 if want else float("inf") if got else 0.0
        print(f"{name} {what}: {got:.0f}, analytic {want:.0f} ({d:+.3%})")
        if abs(d) > bound:
            failures.append(f"{what}: {got} vs analytic {want:.0f}")

    for layout, (p, impl, u, precision, recompute) in LAYOUTS.items():
        sets = [f"parallel.cp={p}", f"parallel.cp_impl={impl}", f"train.precision={precision}",
                f"train.recompute={recompute}"]
        if impl == "hybrid":
            sets.append(f"parallel.cp_ulysses={u}")
        if (precision, recompute) not in singles:
            singles[precision, recompute] = train(
                args, os.path.join(args.workdir, f"single-{precision}-{recompute}"), 1,
                [f"train.precision={precision}", f"train.recompute={recompute}"])
        L = int(cfg["n_layers"])
        replays = 0 if recompute == "none" else L - 1
        last = train(args, os.path.join(args.workdir, layout), p, sets)
        want, buffers, fewer = analytic(cfg, p, u, params, 1 if precision == "fp32" else 0.5,
                                        replays)
        # The cp axis, and under hybrid the groups split off it ("cp-a2a", "cp-ring").
        got = {}
        for group, kinds in last["comm_bytes"].items():
            if group == "cp" or group.startswith("cp-"):
                for kind, n in kinds.items():
                    got[kind] = got.get(kind, 0) + n
        for kind in sorted(set(got) | set(want)):
            check(f"{layout} {kind} bytes/step", got.get(kind, 0), want.get(kind, 0), 0.01)
        plan = run([args.llmtrain, "plan", "--config", args.config, "--world", str(p)] +
                   [a for s in SETS + sets for a in ("--set", s)])
        planned = re.search(r"cp bytes per step per rank .*: send (\d+), recv (\d+), "
                            r"all_to_all (\d+), all_gather (\d+), reduce_scatter (\d+)", plan)
        if not planned:
            failures.append(f"{layout}: plan prints no cp bytes line:\n{plan}")
        else:
            kinds = ("send", "recv", "all_to_all", "all_gather", "reduce_scatter")
            for kind, value in zip(kinds, planned.groups()):
                check(f"{layout} plan {kind} bytes/step vs counters", int(value), got.get(kind, 0),
                      0.0)
        peak = last["peak_bytes"]
        check(f"{layout} peak activations x cp", peak["activations"] * p,
              singles[precision, recompute]["peak_bytes"]["activations"] - fewer, 0.01)
        check(f"{layout} cp buffers", peak["comm"], buffers, 0.0)
    finish(failures)


if __name__ == "__main__":
    main()
