"""Training throughput of llmtrain against PyTorch on the GPT-2 124M shape, same machine, same
environment, same thread count, in fp32 and in bf16. The PyTorch peer is tests/reference/model.py
(the same architecture) with torch.optim.AdamW and clip_grad_norm_ — an idiomatic eager training
step — in float32 and under torch.autocast("cpu", dtype=torch.bfloat16) (bf16 matmuls, fp32
weights and optimizer). llmtrain runs train.precision = "fp32" and "bf16" (16-bit activations
and compute copy, fp32 masters: docs/model.md, "Precision").

Reports per shape tokens/s (median over the timed steps, after warm-up) of the four runs, llmtrain
bf16 against llmtrain fp32 and against the faster PyTorch run, MFU against the fp32 peak llmtrain
detects on this machine (its metrics' mfu; the same peak for every run), and llmtrain's peak
activation bytes in bf16 against fp32. The CPU model and whether it has AVX512-BF16 are printed
with the figures (the machines change from one day to the next).

  /usr/bin/python3 scripts/bench/bench_vs_torch.py --llmtrain build/app/llmtrain [--steps 6]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "reference"))


def flops_per_token(V, L, C, T):
    n = V * C + L * 12 * C * C  # GPT-2's matmul weights: the tied head, qkv, proj, fc1, fc2
    return 6 * n + 6 * L * C * T  # as ModelSpec::flops_per_token counts them


def run_llmtrain(binary, B, T, steps, threads, workdir, precision):
    run_dir = pathlib.Path(workdir) / f"llmtrain_{precision}_{B}x{T}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run (an earlier one would be refused)
    cmd = [binary, "train", "--config", str(ROOT / "configs" / "gpt2-124m.toml"), "-q",
           "--set", f"train.steps={steps}", "--set", f"train.global_batch_size={B}",
           "--set", f"train.micro_batch_size={B}", "--set", f"model.seq_len={T}",
           "--set", "optimizer.warmup_steps=1", "--set", f"train.threads={threads}",
           "--set", f"train.precision={precision}", "--set", f"train.run_dir={run_dir}"]
    subprocess.run(cmd, check=True)
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = rows[2:]  # the first steps warm caches and page in memory
    return {"tok_s": statistics.median(r["tokens_per_s"] for r in timed),
            "mfu": statistics.median(r["mfu"] for r in timed),
            "peak_bytes": rows[0]["peak_bytes"]["total"],
            "activation_bytes": max(r["peak_bytes"]["activations"] for r in rows)}


def run_torch(B, T, steps, threads, bf16):
    import torch
    from model import ModelCfg, Transformer

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Transformer(ModelCfg(vocab_size=50257, n_layers=12, d_model=768, n_heads=12, seq_len=T))
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    times = []
    for _ in range(steps):
        samples = torch.randint(0, 50257, (B, T + 1))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model.loss(samples)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(B * T / t for t in times[2:])


def cpu_model():
    """The CPU's model name and whether it has AVX512-BF16 (/proc/cpuinfo)."""
    name, flags = "unknown", set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown":
                name = value.strip()
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return name, "avx512_bf16" in flags, "avx512f" in flags


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--shapes", default="4x64,1x1024", help="BxT,BxT,...")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    import torch
    env = {k: os.environ.get(k, "") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS")}
    cpu, bf16_isa, avx512 = cpu_model()
    print(f"cpu {cpu} (AVX-512: {'yes' if avx512 else 'no'}, AVX512-BF16: "
          f"{'yes' if bf16_isa else 'no'}), threads {args.threads}, torch {torch.__version__}, "
          f"env {env}")
    results = []
    with tempfile.TemporaryDirectory() as work:
        for shape in args.shapes.split(","):
            B, T = map(int, shape.split("x"))
            ours = {p: run_llmtrain(args.llmtrain, B, T, args.steps, args.threads, work, p)
                    for p in ("fp32", "bf16")}
            theirs = {"fp32": run_torch(B, T, args.steps, args.threads, False),
                      "bf16": run_torch(B, T, args.steps, args.threads, True)}
            # The fp32 peak llmtrain detected, from its fp32 run's tokens/s and MFU.
            fpt = flops_per_token(50257, 12, 768, T)
            peak = ours["fp32"]["tok_s"] * fpt / ours["fp32"]["mfu"]
            best_torch = max(theirs.values())
            row = {"batch": B, "seq": T,
                   "llmtrain_fp32_tok_s": ours["fp32"]["tok_s"],
                   "llmtrain_bf16_tok_s": ours["bf16"]["tok_s"],
                   "torch_fp32_tok_s": theirs["fp32"], "torch_bf16_autocast_tok_s": theirs["bf16"],
                   "bf16_vs_fp32": ours["bf16"]["tok_s"] / ours["fp32"]["tok_s"],
                   "bf16_vs_best_torch": ours["bf16"]["tok_s"] / best_torch,
                   "fp32_vs_torch_fp32": ours["fp32"]["tok_s"] / theirs["fp32"],
                   "peak_flops": peak,
                   "mfu": {k: v * fpt / peak for k, v in
                           (("llmtrain_fp32", ours["fp32"]["tok_s"]),
                            ("llmtrain_bf16", ours["bf16"]["tok_s"]),
                            ("torch_fp32", theirs["fp32"]), ("torch_bf16", theirs["bf16"]))},
                   "activation_bytes": {p: ours[p]["activation_bytes"] for p in ours},
                   "activations_bf16_vs_fp32":
                       ours["bf16"]["activation_bytes"] / ours["fp32"]["activation_bytes"],
                   "peak_bytes": {p: ours[p]["peak_bytes"] for p in ours}}
            results.append(row)
            print(f"B={B:<2} T={T:<5} llmtrain fp32 {ours['fp32']['tok_s']:7.1f} bf16 "
                  f"{ours['bf16']['tok_s']:7.1f} tok/s | torch fp32 {theirs['fp32']:7.1f} "
                  f"bf16-autocast {theirs['bf16']:7.1f} tok/s | llmtrain bf16/fp32 "
                  f"{row['bf16_vs_fp32']:.2f}x, bf16/faster torch {row['bf16_vs_best_torch']:.2f}x, "
                  f"fp32/torch fp32 {row['fp32_vs_torch_fp32']:.2f}x | MFU (of "
                  f"{peak / 1e9:.0f} GFLOP/s) " +
                  ", ".join(f"{k} {100 * v:.1f}%" for k, v in row["mfu"].items()) +
                  f" | activations bf16/fp32 {row['activations_bf16_vs_fp32']:.3f}", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"cpu": cpu, "avx512_bf16": bf16_isa,
                                                      "env": env, "threads": args.threads,
                                                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
