"""Training throughput of llmtrain against PyTorch on the GPT-2 124M shape, same machine, same
environment, same thread count. The PyTorch peer is tests/reference/model.py (float32, the same
architecture) with torch.optim.AdamW and clip_grad_norm_ — an idiomatic eager training step.

Reports tokens/s (median over the timed steps, after warm-up), the ratio, and MFU against the
fp32 peak that llmtrain assumes (log.peak_flops; docs/references.md: ~520 GFLOP/s on 2 Zen 5 cores).

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


def run_llmtrain(binary, B, T, steps, threads, workdir):
    run_dir = pathlib.Path(workdir) / f"llmtrain_{B}x{T}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run (an earlier one would be refused)
    cmd = [binary, "train", "--config", str(ROOT / "configs" / "gpt2-124m.toml"), "-q",
           "--set", f"train.steps={steps}", "--set", f"train.global_batch_size={B}",
           "--set", f"train.micro_batch_size={B}", "--set", f"model.seq_len={T}",
           "--set", "optimizer.warmup_steps=1", "--set", f"train.threads={threads}",
           "--set", f"train.run_dir={run_dir}"]
    subprocess.run(cmd, check=True)
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = rows[2:]  # the first steps warm caches and page in memory
    return statistics.median(r["tokens_per_s"] for r in timed), rows[0]["peak_bytes"]["total"]


def run_torch(B, T, steps, threads):
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
        loss = model.loss(samples)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(B * T / t for t in times[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--peak-gflops", type=float, default=520.0)
    ap.add_argument("--shapes", default="4x64,1x1024", help="BxT,BxT,...")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    import torch
    env = {k: os.environ.get(k, "") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS")}
    print(f"threads {args.threads}, torch {torch.__version__}, env {env}")
    results = []
    with tempfile.TemporaryDirectory() as work:
        for shape in args.shapes.split(","):
            B, T = map(int, shape.split("x"))
            ours, peak_bytes = run_llmtrain(args.llmtrain, B, T, args.steps, args.threads, work)
            theirs = run_torch(B, T, args.steps, args.threads)
            fpt = flops_per_token(50257, 12, 768, T)
            row = {"batch": B, "seq": T, "llmtrain_tok_s": ours, "torch_tok_s": theirs,
                   "ratio": ours / theirs, "llmtrain_mfu": ours * fpt / (args.peak_gflops * 1e9),
                   "torch_mfu": theirs * fpt / (args.peak_gflops * 1e9),
                   "llmtrain_peak_bytes": peak_bytes}
            results.append(row)
            print(f"B={B:<2} T={T:<5} llmtrain {ours:8.1f} tok/s (MFU {100 * row['llmtrain_mfu']:4.1f}%)"
                  f" | torch {theirs:8.1f} tok/s (MFU {100 * row['torch_mfu']:4.1f}%)"
                  f" | ratio {row['ratio']:.2f}x", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"env": env, "threads": args.threads,
                                                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
