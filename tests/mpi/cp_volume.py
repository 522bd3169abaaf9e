#!/usr/bin/python3
"""Context-parallel communication and memory per step against the analytic figures
(docs/parallelism.md, "Context parallelism"), from the cp communicator's counters and the
allocator's peaks in metrics.jsonl.

Per micro-batch and layer, with B = micro_batch_size, p = cp, Tl = seq_len/p positions per rank,
H/KV query/kv heads, D head dim, 4-byte floats, f = (p-1)/p:
  ring     E = 4 B Tl 2KV D (one rank's K and V). Forward: p-1 exchanges of E; backward: p-1 of
           the K/V and p of the dK/dV accumulators. send = recv = (3p - 2) E.
  ulysses  all-to-all of qkv (Q = 4 B Tl (H+2KV) D) and the output (O = 4 B Tl H D) forward; of
           qkv and dout to heads and dqkv back in backward: f (3Q + 2O).
times L layers and gbs/mbs micro-batches; the gradient all-reduce over dp x cp (here the cp
group) adds 2f * 4P for P parameters. Checked within 1% (the counts are exact).

Memory: every activation is per position, so the peak `activations` at cp = p is the cp = 1 peak
over p (within 1%: 64-byte alignment of each tensor), and the cp buffers (`comm`) are
  ring     4E + 4 B Tl H D + 4 B H Tl + 4 p Tl  (two K/V and two dK/dV buffers, one block's
           output and lse, every rank's positions)
  ulysses  2Q + 2Q + 2O + 4 B (H/p) seq_len + 4 p Tl  (all-to-all send and receive staging;
           head-sharded qkv and dqkv, Q each; output and dout, O each; lse; positions)
each rounded up to 64 bytes, exactly.

`llmtrain plan` prints the same send/recv/all-to-all bytes per step (its C++ formula,
cp_bytes_per_layer): they must equal the counters exactly.

Load balance is not measured here: test_context_parallel counts the causal (query, key) pairs
per rank, equal under the zigzag split."""
import json
import os
import re
import shutil

from harness import finish, parse_args, resolved_config, run

LAYOUTS = {"cp2-ring": (2, "ring"), "cp4-ring": (4, "ring"), "cp2-ulysses": (2, "ulysses"),
           "cp4-ulysses": (4, "ulysses")}
SETS = ["train.steps=2", "train.threads=1", "log.progress=false", "model.n_kv_heads=4"]


def up64(n):
    return (n + 63) // 64 * 64


def analytic(cfg, p, impl, params):
    L, C, T = int(cfg["n_layers"]), int(cfg["d_model"]), int(cfg["seq_len"])
    H, KV = int(cfg["n_heads"]), int(cfg["n_kv_heads"]) or int(cfg["n_heads"])
    B, gbs = int(cfg["micro_batch_size"]), int(cfg["global_batch_size"])
    D, Tl, f, micro = C // H, T // p, (p - 1) / p, gbs // B
    E, Q, O = 4 * B * Tl * 2 * KV * D, 4 * B * Tl * (H + 2 * KV) * D, 4 * B * Tl * H * D
    comm = {"all_reduce": 2 * f * 4 * params}
    if impl == "ring":
        comm["send"] = comm["recv"] = micro * L * (3 * p - 2) * E
        buffers = 4 * up64(E) + up64(O) + up64(4 * B * H * Tl) + up64(4 * p * Tl)
    else:
        comm["all_to_all"] = micro * L * f * (3 * Q + 2 * O)
        buffers = (4 * up64(Q) + 2 * up64(O) + up64(4 * B * (H // p) * T) + up64(4 * p * Tl))
    return comm, buffers


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
    name = os.path.basename(args.config)

    def check(what, got, want, bound):
        d = got / want - 1 if want else float("inf") if got else 0.0
        print(f"{name} {what}: {got:.0f}, analytic {want:.0f} ({d:+.3%})")
        if abs(d) > bound:
            failures.append(f"{what}: {got} vs analytic {want:.0f}")

    for layout, (p, impl) in LAYOUTS.items():
        last = train(args, os.path.join(args.workdir, layout), p,
                     [f"parallel.cp={p}", f"parallel.cp_impl={impl}"])
        want, buffers = analytic(cfg, p, impl, params)
        got = last["comm_bytes"].get("cp", {})
        for kind in sorted(set(got) | set(want)):
            check(f"{layout} {kind} bytes/step", got.get(kind, 0), want.get(kind, 0), 0.01)
        plan = run([args.llmtrain, "plan", "--config", args.config, "--world", str(p), "--set",
                    f"parallel.cp={p}", "--set", f"parallel.cp_impl={impl}"] +
                   [a for s in SETS for a in ("--set", s)])
        planned = re.search(r"cp bytes per step per rank .*: send (\d+), recv (\d+), "
                            r"all_to_all (\d+)", plan)
        if not planned:
            failures.append(f"{layout}: plan prints no cp bytes line:\n{plan}")
        else:
            for kind, value in zip(("send", "recv", "all_to_all"), planned.groups()):
                check(f"{layout} plan {kind} bytes/step vs counters", int(value), got.get(kind, 0),
                      0.0)
        peak = last["peak_bytes"]
        check(f"{layout} peak activations x cp", peak["activations"] * p,
              single["peak_bytes"]["activations"], 0.01)
        check(f"{layout} cp buffers", peak["comm"], buffers, 0.0)
    finish(failures)


if __name__ == "__main__":
    main()
