#!/usr/bin/python3
"""The golden set: a fixed list of small runs whose metrics and checkpoints a refactor must leave
bitwise unchanged on the same machine. Record before the change, record after, compare:

    /usr/bin/python3 scripts/golden.py record --llmtrain OLD/llmtrain --out /tmp/golden-before
    /usr/bin/python3 scripts/golden.py record --llmtrain build/app/llmtrain --out /tmp/golden-after
    /usr/bin/python3 scripts/golden.py compare /tmp/golden-before /tmp/golden-after

Each run trains the parity configs of tests/mpi/configs for a few steps and saves a checkpoint;
`record` writes, per run, the metrics lines without their timings and the SHA-256 of every
dataset of the checkpoint's rank files (read with h5py, so file-level metadata such as creation
times does not count). `compare` lists every run, metric and tensor that differs; exit 1 if any.
Runs: single rank, tp2+sp, ZeRO-3 dp2, pp2 interleaved, cp2 ring, ep2 MoE, bf16 and fp16, full
recompute, on the GPT, Llama and MoE tiny configs; MoE under tp, ep, ZeRO 1-3 and pp together."""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "tests", "mpi", "configs")
L4 = ["model.n_layers=4"]
# name: (config, ranks, --set overrides)
RUNS = {
    "gpt-single": ("gpt-tiny", 1, []),
    "llama-single": ("llama-tiny", 1, []),
    "gpt-tp2-sp": ("gpt-tiny", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "llama-zero3-dp2": ("llama-tiny", 2, ["parallel.zero_stage=3"]),
    "gpt-pp2-interleaved": ("gpt-tiny", 2, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                            "parallel.virtual_stages=2"] + L4),
    "llama-cp2-ring": ("llama-tiny", 2, ["parallel.cp=2", "parallel.cp_impl=ring"]),
    "moe-single": ("moe-tiny", 1, []),
    "moe-ep2": ("moe-tiny", 2, ["parallel.ep=2"]),
    "llama-bf16": ("llama-tiny", 1, ["train.precision=bf16"]),
    "gpt-fp16-dp2": ("gpt-tiny", 2, ["train.precision=fp16"]),
    "llama-recompute-full": ("llama-tiny", 1, ["train.recompute=full"]),
    "moe-recompute-full-ep2": ("moe-tiny", 2, ["train.recompute=full", "parallel.ep=2"]),
    # Every gradient group of ZeRO's parts and DDP's buckets (ModelSpec::grad_group): the routed
    # parameters over tp x dp, the experts over their ep coordinate's ranks (times tp).
    "moe-tp2-sp-zero1": ("moe-tiny", 2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                         "parallel.zero_stage=1"]),
    "moe-tp2-ep2-zero2": ("moe-tiny", 4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                          "parallel.ep=2", "parallel.zero_stage=2"]),
    "moe-tp2-ep2-ddp": ("moe-tiny", 4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                        "parallel.ep=2"]),
    "moe-ep2-zero3-dp2": ("moe-tiny", 2, ["parallel.ep=2", "parallel.zero_stage=3"]),
    "moe-pp2-ep2-zero1": ("moe-tiny", 4, ["parallel.pp=2", "parallel.ep=2",
                                          "parallel.zero_stage=1"]),
    # 16-bit storage (docs/model.md, "Precision"): every layout at bf16, so that moving a
    # tensor to 16 bits that the emulation already rounded changes no bit.
    "gpt-bf16-tp2-sp": ("gpt-tiny", 2, ["train.precision=bf16", "parallel.tp=2",
                                        "parallel.sequence_parallel=true"]),
    "llama-bf16-zero3-dp2": ("llama-tiny", 2, ["train.precision=bf16", "parallel.zero_stage=3"]),
    "gpt-bf16-pp2-zbh1": ("gpt-tiny", 2, ["train.precision=bf16", "parallel.pp=2",
                                          "parallel.pp_schedule=zb-h1"] + L4),
    "llama-bf16-cp2-ring": ("llama-tiny", 2, ["train.precision=bf16", "parallel.cp=2",
                                              "parallel.cp_impl=ring"]),
    "moe-bf16-ep2-tp2-sp": ("moe-tiny", 4, ["train.precision=bf16", "parallel.ep=2",
                                            "parallel.tp=2", "parallel.sequence_parallel=true"]),
    "llama-bf16-recompute-selective": ("llama-tiny", 1, ["train.precision=bf16",
                                                         "train.recompute=selective"]),
    "moe-bf16-recompute-full": ("moe-tiny", 1, ["train.precision=bf16", "train.recompute=full"]),
    "gpt-bf16-zero1-dp2": ("gpt-tiny", 2, ["train.precision=bf16", "parallel.zero_stage=1"]),
    "llama-fp16-zero2-dp2": ("llama-tiny", 2, ["train.precision=fp16", "parallel.zero_stage=2"]),
    "moe-bf16-zero2-ep2-dp2": ("moe-tiny", 2, ["train.precision=bf16", "parallel.ep=2",
                                               "parallel.zero_stage=2"]),
    "llama-bf16-cp4-hybrid": ("llama-tiny", 4, ["train.precision=bf16", "parallel.cp=4",
                                                "parallel.cp_impl=hybrid", "parallel.cp_ulysses=2",
                                                "model.n_kv_heads=4"]),
    "gpt-fp16-cp2-ulysses": ("gpt-tiny", 2, ["train.precision=fp16", "parallel.cp=2",
                                             "parallel.cp_impl=ulysses"]),
}
STEPS = 4
TIMING = {"tokens_per_s", "mfu", "step_time_s", "data_wait_s", "elapsed_s", "eta_s",
          "pp_bubble", "time_s", "wall_s"}


def strip(obj):
    """A metrics line without its wall-clock fields (any key naming a time or a rate)."""
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items()
                if k not in TIMING and not k.endswith(("_s", "_per_s"))}
    return obj


def tensor_hashes(ckpt):
    import h5py  # Debian's python3-h5py (scripts/common.sh installs it with the test packages)
    out = {}
    for name in sorted(os.listdir(ckpt)):
        if not name.endswith(".h5") or name == "index.h5":
            continue
        with h5py.File(os.path.join(ckpt, name), "r") as f:
            def visit(path, obj):
                if isinstance(obj, h5py.Dataset):
                    out[f"{name}:{path}"] = hashlib.sha256(obj[()].tobytes()).hexdigest()
            f.visititems(visit)
    return out


def record(args):
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    env = {**os.environ}
    # bf16 GEMMs through sgemm on every CPU: oneDNN's bf16 path (CPUs with AVX512-BF16) sums in
    # another order, and a binary without it would differ from one with it on such a CPU.
    env.setdefault("LLMTRAIN_CPU_BF16_GEMM", "blas")
    if os.getuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = {}
    for name, (config, ranks, sets) in RUNS.items():
        if args.only and name not in args.only:
            continue
        run_dir = os.path.join(args.out, name)
        cmd = [args.llmtrain, "train", "--config", os.path.join(CONFIGS, config + ".toml"), "-q"]
        for s in sets + [f"train.steps={STEPS}", f"train.run_dir={run_dir}",
                         f"checkpoint.dir={run_dir}/ckpt", "log.progress=false"]:
            cmd += ["--set", s]
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"{name}: {' '.join(cmd)} exited {r.returncode}\n{r.stdout}{r.stderr}")
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            metrics = [strip(json.loads(line)) for line in f]
        ckpt = os.path.join(run_dir, "ckpt", f"step_{STEPS:08d}")
        result[name] = {"metrics": metrics, "tensors": tensor_hashes(ckpt)}
        print(f"{name}: {len(metrics)} steps, loss {metrics[-1]['loss']!r}, "
              f"{len(result[name]['tensors'])} tensors")
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)


def compare(args):
    with open(os.path.join(args.before, "golden.json")) as f:
        a = json.load(f)
    with open(os.path.join(args.after, "golden.json")) as f:
        b = json.load(f)
    diffs = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            diffs.append(f"{name}: only in {'after' if name in b else 'before'}")
            continue
        ma, mb = a[name]["metrics"], b[name]["metrics"]
        for step, (x, y) in enumerate(zip(ma, mb), 1):
            for k in sorted(set(x) | set(y)):
                if x.get(k) != y.get(k):
                    diffs.append(f"{name} step {step} {k}: {x.get(k)!r} -> {y.get(k)!r}")
        if len(ma) != len(mb):
            diffs.append(f"{name}: {len(ma)} -> {len(mb)} metrics lines")
        ta, tb = a[name]["tensors"], b[name]["tensors"]
        for t in sorted(set(ta) | set(tb)):
            if ta.get(t) != tb.get(t):
                diffs.append(f"{name} {t}: {'differs' if t in ta and t in tb else 'missing'}")
        print(f"{name}: {len(ma)} metrics lines, {len(ta)} tensors compared")
    for d in diffs:
        print(d)
    print(f"golden: {len(a)} runs, {len(diffs)} differences")
    return 1 if diffs else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run the golden set and write OUT/golden.json")
    r.add_argument("--llmtrain", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--only", nargs="*", help="run only these names")
    c = sub.add_parser("compare", help="compare two recordings bitwise")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args()
    sys.exit(record(args) if args.cmd == "record" else compare(args))


if __name__ == "__main__":
    main()
