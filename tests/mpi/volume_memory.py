#!/usr/bin/python3
"""Communication volume per step and peak memory per rank of DDP and ZeRO 1-3 at dp = 4, fp32,
against the analytic values (docs/parallelism.md), from one run per stage.

Volume (bytes this rank sends per step, ring algorithms, Psi parameters, 4 bytes each, Nd = 4):
  DDP, ZeRO-1, ZeRO-2: 2 * 4Psi * (Nd-1)/Nd   (all-reduce = reduce-scatter + all-gather)
  ZeRO-3:              3 * 4Psi * (Nd-1)/Nd   (gather for forward, for backward, reduce-scatter)
  within 5%. ZeRO-3 keeps the root unit (embeddings + head) gathered from forward to backward,
  so it moves (3Psi - Psi_root) elements: that exact figure is checked to 0.5% as well.
Memory (peak bytes of params + grads + optimizer state, fp32 training: params 4Psi, grads 4Psi,
Adam m+v 8Psi):
  DDP 16Psi; ZeRO-1 4Psi + 4Psi + 8Psi/Nd; ZeRO-2 4Psi + (4Psi + 8Psi)/Nd; ZeRO-3 16Psi/Nd
  within 10%; staging buffers (gathered units, packed collectives) are the `comm` category,
  reported next to it."""
import json
import os
import re
import shutil

from harness import finish, parse_args, resolved_config, run

ND = 4
SETS = ["model.n_layers=4", "train.steps=2", "train.global_batch_size=8", "train.micro_batch_size=2",
        "train.threads=1", "log.progress=false"]


def main():
    args = parse_args()
    shown, cfg = resolved_config(args, SETS)
    sets = []
    for s in SETS:
        sets += ["--set", s]
    psi = int(re.search(r"# parameters: (\d+)", shown).group(1))
    # Root unit: embeddings (wte, wpe) and final norm; with vocab V, seq T, width C (gpt2 preset).
    V, T, C = int(cfg["vocab_size"]), int(cfg["seq_len"]), int(cfg["d_model"])
    psi_root = V * C + T * C + 2 * C
    frac = (ND - 1) / ND
    analytic_volume = {0: 2 * 4 * psi * frac, 1: 2 * 4 * psi * frac, 2: 2 * 4 * psi * frac,
                       3: 3 * 4 * psi * frac}
    analytic_memory = {0: 16 * psi, 1: 8 * psi + 8 * psi / ND, 2: 4 * psi + 12 * psi / ND,
                       3: 16 * psi / ND}
    failures = []
    print(f"Psi = {psi} parameters, dp = {ND}, fp32")
    print("stage | bytes/step measured | analytic | diff | p+g+opt peak | formula | diff | comm staging peak")
    for stage in range(4):
        out = os.path.join(args.workdir, f"zero{stage}")
        shutil.rmtree(out, ignore_errors=True)
        run([args.mpirun, "--oversubscribe", "-np", str(ND), args.llmtrain, "train", "--config",
             args.config, "-q", "--set", f"parallel.zero_stage={stage}", "--set",
             f"train.run_dir={out}"] + sets)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            last = [json.loads(line) for line in f][-1]
        vol = sum(last["comm_bytes"]["dp"].values())
        peak = last["peak_bytes"]
        mem = peak["params"] + peak["grads"] + peak["optimizer"]
        dv = vol / analytic_volume[stage] - 1
        dm = mem / analytic_memory[stage] - 1
        print(f"{stage} | {vol} | {analytic_volume[stage]:.0f} | {dv:+.2%} | {mem} | "
              f"{analytic_memory[stage]:.0f} | {dm:+.2%} | {peak['comm']}   {last['comm_bytes']['dp']}")
        if abs(dv) > 0.05:
            failures.append(f"stage {stage}: volume {vol} vs analytic {analytic_volume[stage]:.0f}")
        if abs(dm) > 0.10:
            failures.append(f"stage {stage}: memory {mem} vs formula {analytic_memory[stage]:.0f}")
        if stage == 3:
            exact = (3 * psi - psi_root) * 4 * frac
            if abs(vol / exact - 1) > 0.005:
                failures.append(f"stage 3: volume {vol} vs (3Psi - Psi_root) schedule {exact:.0f}")
    finish(failures)


if __name__ == "__main__":
    main()
