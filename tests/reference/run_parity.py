#!/usr/bin/python3
"""Parity of llmtrain against the independent PyTorch reference (tests/reference/model.py).

  run_parity.py --llmtrain build/app/llmtrain --preset gpt2|llama --workdir DIR
                [--steps 10] [--micro-batches 1] [--self-test]

1. writes DIR/cfg.toml (tiny model, fp32, synthetic data, run_dir DIR/run),
2. runs `llmtrain train --config DIR/cfg.toml --dump-dir DIR/dump`,
3. loads DIR/dump/params.{json,bin} (initial weights) and DIR/dump/tokens.bin (each step's global
   batch) into the reference, runs the same steps (micro-batch accumulation, grad-norm, clipping,
   AdamW, LR schedule of docs/model.md) in float64,
4. compares per step loss, grad_norm and lr with DIR/run/metrics.jsonl.

Tolerance on loss and grad_norm (relative): 1e-5 at step 1, growing log-linearly to 1e-4 at
step 10, 1e-4 after. lr: 1e-6 relative. Exit status 0 = parity, 1 = mismatch, 2 = could not run.
--self-test additionally perturbs one initial weight in the reference and requires that the
comparison then FAILS (proves the check can fail).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import (AdamW, MlaCfg, ModelCfg, MoeCfg, OptCfg, Transformer, f32, grad_norm_and_clip,  # noqa: E402
                   lr_at, rope_freqs)

PRESETS = {
    # arch-only presets: the switches (norm, activation, position, bias, tying, d_ff) are left to
    # llmtrain's preset defaults and resolved independently by ModelCfg.resolved().
    "gpt2": dict(arch="gpt2", vocab_size=97, n_layers=2, d_model=64, n_heads=4, n_kv_heads=0, seq_len=32),
    "llama": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seq_len=32),
    # Mixture of experts ([model.moe], docs/model.md): Mixtral-style softmax top-2 with the aux loss;
    # sigmoid scores with a shared expert, the z-loss and a dense first layer; Switch-style top-1
    # unnormalised with capacity dropping (gelu experts).
    "moe-softmax": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seq_len=32,
                        moe=dict(num_experts=4, top_k=2, d_ff_expert=64)),
    "moe-sigmoid": dict(arch="llama", vocab_size=101, n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, seq_len=32,
                        moe=dict(num_experts=6, top_k=2, d_ff_expert=32, router="sigmoid", shared_experts=1,
                                 d_ff_shared=48, z_loss_coef=1e-3, aux_loss_coef=0.02, first_dense_layers=1)),
    "moe-capacity": dict(arch="gpt2", vocab_size=97, n_layers=2, d_model=64, n_heads=4, seq_len=32,
                         moe=dict(num_experts=4, top_k=1, d_ff_expert=64, normalize=False, capacity_factor=1.0)),
    # DeepSeek-V3 style: fine-grained sigmoid experts, a shared expert, aux-loss-free balancing (a
    # rate large enough to move the routing within 10 steps).
    "moe-bias": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seq_len=32,
                     moe=dict(num_experts=8, top_k=2, d_ff_expert=16, router="sigmoid", balance="bias",
                              bias_update_rate=0.01, shared_experts=1, d_ff_shared=32)),
    # DeepSeek-V3's router: group-limited (2 of 4 groups of 4), weights scaled by 2.5.
    "moe-group": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seq_len=32,
                      moe=dict(num_experts=16, top_k=4, d_ff_expert=16, router="sigmoid", balance="bias",
                               bias_update_rate=0.01, shared_experts=1, d_ff_shared=32, n_group=4,
                               topk_group=2, routed_scaling_factor=2.5)),
    # DeepSeek-V3's multi-head latent attention at toy ranks (values narrower than the query/key
    # heads, as V3's 128 against 192), with a low-rank query, and with a full-rank one.
    "mla": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, seq_len=32,
                mla=dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)),
    "mla-q": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, seq_len=32,
                  mla=dict(q_lora_rank=0, kv_lora_rank=16, qk_nope_head_dim=6, qk_rope_head_dim=6, v_head_dim=12)),
    # RoPE scaling ([model.rope_scaling]): Llama 3.1's bands over an original context of 32 (with
    # head dim 16 one pair kept, one interpolated, six divided by the factor), and YaRN on latent
    # attention as DeepSeek-V3 runs it (the scores times m(s, mscale_all_dim)^2), with mscale !=
    # mscale_all_dim so that cos and sin are scaled too.
    "llama-rope-llama3": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2,
                              seq_len=32, rope_scaling=dict(rope_type="llama3", factor=4.0,
                                                            original_max_position_embeddings=32,
                                                            low_freq_factor=1.0, high_freq_factor=4.0)),
    "mla-yarn": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, seq_len=32,
                     mla=dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=6),
                     rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8,
                                       beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=1.0)),
    # DeepSeek-V3's multi-token prediction: two sequential modules (untied Llama; weight 0.3), and
    # one on a tied GPT-2 (learned positions: the module's embedding has none).
    "mtp": dict(arch="llama", vocab_size=101, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seq_len=32,
                mtp_depth=2, mtp_loss_weight=0.3),
    "mtp-gpt2": dict(arch="gpt2", vocab_size=97, n_layers=2, d_model=64, n_heads=4, seq_len=32,
                     mtp_depth=1, mtp_loss_weight=0.5),
}
GLOBAL_BATCH = 4
OPT = dict(lr=1e-3, min_lr=1e-4, warmup_steps=2, decay="cosine", weight_decay=0.1, grad_clip=1.0,
           beta1=0.9, beta2=0.95, eps=1e-8)
SEED = 1234


class Fail(Exception):
    pass


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        s = repr(v)
        return s if any(c in s for c in ".eEn") else s + ".0"
    if isinstance(v, str):
        return json.dumps(v)
    raise TypeError(v)


def write_config(path: Path, sections: dict) -> None:
    lines = ["# written by tests/reference/run_parity.py"]
    for sec, kv in sections.items():
        lines.append(f"\n[{sec}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in kv.items()]
    path.write_text("\n".join(lines) + "\n")


def read_metrics(path: Path) -> dict[int, dict]:
    if not path.exists():
        raise Fail(f"llmtrain wrote no metrics file {path}")
    out = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        if "step" not in rec or "loss" not in rec:
            continue
        for key in ("loss", "grad_norm", "lr"):
            if key not in rec:
                raise Fail(f"{path}:{i}: record for step {rec['step']} has no {key!r}: {line}")
        if rec.get("skipped", False):
            raise Fail(f"{path}:{i}: step {rec['step']} was skipped (overflow?) in an fp32 run: {line}")
        out.setdefault(int(rec["step"]), rec)
    return out


def check_init(model: Transformer) -> list[str]:
    """docs/model.md Initialisation: N(0, init_std) matrices/embeddings, residual projections
    N(0, init_std / sqrt(2L)), biases 0, norm weights 1 (statistics only: 10% on the std)."""
    errors = []
    c = model.cfg
    for n, p in model.named_parameters():
        p = p.detach().double()
        if p.dim() >= 2:
            want = c.init_std / math.sqrt(2 * c.n_layers) if n.endswith(("attn.proj.weight", "fc2.weight")) else c.init_std
            mean, std = p.mean().item(), p.std().item()
            if abs(std / want - 1) > 0.1 or abs(mean) > 5 * want / math.sqrt(p.numel()):
                errors.append(f"init {n}: mean {mean:.2e}, std {std:.5f}, doc says N(0, {want:.5f})")
        elif n.endswith((".bias", ".expert_bias")):  # biases and the balancing bias start at 0
            if p.abs().max().item() != 0:
                errors.append(f"init {n}: biases should be 0, max |b| = {p.abs().max().item():.3e}")
        elif not torch.all(p == 1):
            errors.append(f"init {n}: norm weights should be 1")
    return errors


def reference_run(model: Transformer, opt: OptCfg, tokens: np.ndarray,
                  micro_batch: int) -> list[tuple[float, float, float, float | None]]:
    """Runs len(tokens) optimizer steps; returns per step (loss, grad_norm, lr, MTP loss: the mean
    over depths, None without MTP)."""
    params = list(model.parameters())
    adam = AdamW(model.named_parameters(), opt)
    accum = tokens.shape[1] // micro_batch
    rows = []
    for s, batch in enumerate(tokens, 1):
        batch = torch.from_numpy(batch.astype(np.int64))
        model.zero_grad(set_to_none=True)
        loss_sum = mtp_sum = 0.0
        for i in range(accum):
            loss, router, mtp = model.objective(batch[i * micro_batch : (i + 1) * micro_batch])
            total = loss + router
            if mtp:
                total = total + model.cfg.mtp_loss_weight / len(mtp) * sum(mtp)
                mtp_sum += sum(l.item() for l in mtp) / len(mtp)
            (total / accum).backward()
            loss_sum += loss.item()
        norm = grad_norm_and_clip(params, opt.grad_clip)
        lr = lr_at(opt, s)
        adam.step(lr)
        for block in model.layers:
            if hasattr(block.mlp, "balance"):
                block.mlp.balance()
        rows.append((loss_sum / accum, norm, lr, mtp_sum / accum if model.cfg.mtp_depth > 0 else None))
    return rows


def tolerance(step: int, first: float, last: float, last_step: int = 10) -> float:
    if step >= last_step:
        return last
    return first * (last / first) ** ((step - 1) / (last_step - 1))


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def compare(ours, metrics, args, quiet=False) -> list[str]:
    """Returns the list of mismatches (empty = parity)."""
    errors = []
    if not quiet:
        print(f"{'step':>4} | {'loss llmtrain':>13} {'loss torch':>13} {'rel':>8} | "
              f"{'gnorm llmtrain':>14} {'gnorm torch':>13} {'rel':>8} | {'lr rel':>8} | {'tol':>7}")
    for s, (loss, norm, lr, mtp) in enumerate(ours, 1):
        if s not in metrics:
            errors.append(f"step {s}: missing from metrics.jsonl")
            continue
        m = metrics[s]
        tol = tolerance(s, args.tol_first, args.tol_last)
        dl, dg, dr = rel(m["loss"], loss), rel(m["grad_norm"], norm), rel(m["lr"], lr)
        if not quiet:
            flag = "" if max(dl, dg) <= tol and dr <= args.lr_tol else "  <-- MISMATCH"
            print(f"{s:>4} | {m['loss']:>13.8f} {loss:>13.8f} {dl:>8.1e} | "
                  f"{m['grad_norm']:>14.8f} {norm:>13.8f} {dg:>8.1e} | {dr:>8.1e} | {tol:>7.1e}{flag}")
        if not (dl <= tol):  # written so that NaN fails
            errors.append(f"step {s}: loss llmtrain {m['loss']!r} vs torch {loss!r}: rel {dl:.3e} > {tol:.1e}")
        if not (dg <= tol):
            errors.append(f"step {s}: grad_norm llmtrain {m['grad_norm']!r} vs torch {norm!r}: rel {dg:.3e} > {tol:.1e}")
        if not (dr <= args.lr_tol):
            errors.append(f"step {s}: lr llmtrain {m['lr']!r} vs schedule {lr!r}: rel {dr:.3e} > {args.lr_tol:.1e}")
        if mtp is not None:
            dm = rel(m["mtp_loss"], mtp) if "mtp_loss" in m else math.inf
            if not quiet:
                print(f"     | mtp_loss llmtrain {m.get('mtp_loss', float('nan')):.8f} torch {mtp:.8f} rel {dm:.1e}")
            if not (dm <= tol):
                errors.append(f"step {s}: mtp_loss llmtrain {m.get('mtp_loss')!r} vs torch {mtp!r}: rel {dm:.3e} > {tol:.1e}")
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llmtrain", required=True, help="path to the llmtrain binary")
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--workdir", required=True, help="scratch directory (its cfg.toml, run/, dump/ are replaced)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step (global batch 4)")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="reference precision")
    ap.add_argument("--tol-first", type=float, default=1e-5, help="relative tolerance at step 1")
    ap.add_argument("--tol-last", type=float, default=1e-4, help="relative tolerance at step >= 10")
    ap.add_argument("--lr-tol", type=float, default=1e-6)
    ap.add_argument("--self-test", action="store_true", help="also check that a perturbed weight makes parity fail")
    ap.add_argument("--threads", type=int, default=0, help="train.threads for llmtrain (0 = all cores)")
    args = ap.parse_args()

    if GLOBAL_BATCH % args.micro_batches:
        print(f"--micro-batches must divide the global batch {GLOBAL_BATCH}", file=sys.stderr)
        return 2
    micro_batch = GLOBAL_BATCH // args.micro_batches
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    run_dir, dump_dir, cfg_path = work / "run", work / "dump", work / "cfg.toml"
    for d in (run_dir, dump_dir):
        if d.exists():
            shutil.rmtree(d)

    model_kv = dict(PRESETS[args.preset])
    moe_kv = model_kv.pop("moe", None)
    mla_kv = model_kv.pop("mla", None)
    rope_kv = model_kv.pop("rope_scaling", None)
    model_toml = {k: v for k, v in model_kv.items() if not (k == "n_kv_heads" and v == 0)}
    model_toml["dropout"] = 0.0
    if mla_kv:
        model_toml["attention"] = "mla"
    write_config(cfg_path, {
        "model": model_toml,
        **({"model.moe": moe_kv} if moe_kv else {}),
        **({"model.mla": mla_kv} if mla_kv else {}),
        **({"model.rope_scaling": rope_kv} if rope_kv else {}),
        "train": dict(steps=args.steps, global_batch_size=GLOBAL_BATCH, micro_batch_size=micro_batch,
                      precision="fp32", seed=SEED, run_dir=str(run_dir), device="cpu", threads=args.threads),
        "optimizer": dict(lr=OPT["lr"], min_lr=OPT["min_lr"], warmup_steps=OPT["warmup_steps"], decay=OPT["decay"],
                          decay_steps=args.steps, weight_decay=OPT["weight_decay"], grad_clip=OPT["grad_clip"],
                          beta1=OPT["beta1"], beta2=OPT["beta2"], eps=OPT["eps"]),
        "data": dict(source="synthetic"),
        "log": dict(progress=False, interval=1),
    })

    cmd = [args.llmtrain, "train", "--config", str(cfg_path), "--dump-dir", str(dump_dir)]
    print("$", " ".join(cmd))
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"could not run llmtrain: {e}", file=sys.stderr)
        return 2
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        print(f"llmtrain exited with {proc.returncode}", file=sys.stderr)
        return 2
    print(f"llmtrain: {time.time() - t0:.1f} s")

    dtype = getattr(torch, args.dtype)
    torch.set_default_dtype(dtype)
    moe = None
    if moe_kv:
        moe = MoeCfg(**{k: f32(v) if isinstance(v, float) else v for k, v in moe_kv.items()})
    mcfg = ModelCfg(**{k: f32(v) if isinstance(v, float) else v for k, v in model_kv.items()}, moe=moe,
                    mla=MlaCfg(**mla_kv) if mla_kv else None,
                    rope_scaling={k: f32(v) if isinstance(v, float) else v for k, v in rope_kv.items()}
                    if rope_kv else None)
    o = OPT
    opt = OptCfg(lr=f32(o["lr"]), min_lr=f32(o["min_lr"]), warmup_steps=o["warmup_steps"], decay=o["decay"],
                 decay_steps=args.steps, beta1=f32(o["beta1"]), beta2=f32(o["beta2"]), eps=f32(o["eps"]),
                 weight_decay=f32(o["weight_decay"]), grad_clip=f32(o["grad_clip"]))

    try:
        model = Transformer(mcfg).to(dtype)
        model.load_dump(dump_dir)
        c = model.cfg
        print(f"reference ({args.dtype}): {args.preset} norm={c.norm} act={c.activation} pos={c.position} bias={c.bias} "
              f"tied={c.tie_embeddings} V={c.vocab_size} L={c.n_layers} C={c.d_model} H={c.n_heads} KV={c.n_kv_heads} "
              f"F={c.d_ff} T={c.seq_len}; {sum(p.numel() for p in model.parameters())} parameters; "
              f"{args.micro_batches} micro-batch(es) of {micro_batch}")
        T = c.seq_len
        raw = np.fromfile(dump_dir / "tokens.bin", dtype="<i4")
        per_step = GLOBAL_BATCH * (T + 1)
        if raw.size != args.steps * per_step:
            raise Fail(f"tokens.bin holds {raw.size} int32, expected steps*global_batch*(seq_len+1) = "
                       f"{args.steps}*{GLOBAL_BATCH}*{T + 1} = {args.steps * per_step}")
        tokens = raw.reshape(args.steps, GLOBAL_BATCH, T + 1)
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise Fail(f"tokens.bin has ids outside [0, {c.vocab_size}): min {tokens.min()}, max {tokens.max()}")
        metrics = read_metrics(run_dir / "metrics.jsonl")
    except (Fail, ValueError, OSError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 2

    init_errors = check_init(model)
    print("initialisation statistics: " + ("as docs/model.md" if not init_errors else f"{len(init_errors)} deviations"))
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    t0 = time.time()
    ours = reference_run(model, opt, tokens, micro_batch)
    print(f"reference: {time.time() - t0:.1f} s")
    errors = init_errors + compare(ours, metrics, args)
    extra = sorted(s for s in metrics if s > args.steps)
    if extra:
        errors.append(f"metrics.jsonl has steps beyond {args.steps}: {extra}")

    if errors:
        print(f"\nPARITY FAILED ({args.preset}, {args.micro_batches} micro-batch(es)):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1
    print(f"\nparity OK ({args.preset}, {args.micro_batches} micro-batch(es), {args.steps} steps)")

    if args.self_test:
        # One weight off by 0.1 (the final norm's gain of channel 0: 1 -> 1.1) must break it.
        name, idx, delta = "norm_f.weight", (0,), 0.1
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(initial[n])
            dict(model.named_parameters())[name][idx] += delta
        bad = reference_run(model, opt, tokens, micro_batch)
        errs = compare(bad, metrics, args, quiet=True)
        if not errs:
            print(f"SELF-TEST FAILED: perturbing {name}{list(idx)} by {delta} still matched llmtrain", file=sys.stderr)
            return 1
        l1, g1 = rel(bad[0][0], ours[0][0]), rel(bad[0][1], ours[0][1])
        print(f"self-test OK: {name}{list(idx)} += {delta} is detected ({len(errs)} mismatches; "
              f"step-1 loss moves {l1:.1e}, grad_norm {g1:.1e} rel; first: {errs[0]})")
        # Each MoE feature must matter: the reference without it must fail.
        variants = []
        if moe is not None and moe.n_group > 1 and 0 < moe.topk_group < moe.n_group:
            variants.append(("without the group limit", dict(n_group=1, topk_group=0)))
            variants.append(("without routed_scaling_factor", dict(routed_scaling_factor=1.0)))
        if moe is not None and moe.balance == "bias":
            variants.append(("without the balancing bias updates", dict(bias_update_rate=0.0)))
        elif moe is not None:
            variants.append(("without router losses", dict(balance="none", z_loss_coef=0.0)))
            if moe.capacity_factor > 0:
                variants.append(("dropless (no capacity)", dict(capacity_factor=0.0)))
        def must_fail(what, change, undo=None):
            """The reference from the initial weights with change() made (undo() after) must no
            longer match llmtrain."""
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(initial[n])
            change()
            bad = reference_run(model, opt, tokens, micro_batch)
            if undo:
                undo()
            errs = compare(bad, metrics, args, quiet=True)
            if not errs:
                print(f"SELF-TEST FAILED: the reference {what} still matched llmtrain", file=sys.stderr)
                return False
            print(f"self-test OK: the reference {what} is detected ({len(errs)} mismatches; first: {errs[0]})")
            return True

        checks = []
        if mcfg.mla is not None:
            # The decoupled RoPE key must matter.
            checks.append(("with an unrotated shared key",
                           lambda: [setattr(b.attn, "rope_keys", False) for b in model.layers], None))
        if mcfg.mtp_depth > 0:
            # The MTP losses' gradient must matter, and the hidden state each module reads (the
            # previous head's normalised input).
            weight = model.cfg.mtp_loss_weight
            checks.append(("without the MTP losses' gradient",
                           lambda: setattr(model.cfg, "mtp_loss_weight", 0.0),
                           lambda: setattr(model.cfg, "mtp_loss_weight", weight)))
            checks.append(("passing the hidden states on before the final norms",
                           lambda: setattr(model, "mtp_prenorm", True),
                           lambda: setattr(model, "mtp_prenorm", False)))
        if mcfg.rope_scaling is not None:
            # The scaled frequencies must matter, and (YaRN with mscale_all_dim) the scores'
            # factor on its own: the same cos and sin given as attention_factor, without it.
            scaling = model.cfg.rope_scaling
            checks.append(("without RoPE scaling", lambda: setattr(model.cfg, "rope_scaling", None),
                           lambda: setattr(model.cfg, "rope_scaling", scaling)))
            if scaling.get("mscale_all_dim"):
                mag = rope_freqs(2, model.cfg.rope_theta, scaling)[1]
                alone = {**scaling, "mscale_all_dim": 0.0, "attention_factor": mag}
                checks.append(("without YaRN's factor on the scores",
                               lambda: setattr(model.cfg, "rope_scaling", alone),
                               lambda: setattr(model.cfg, "rope_scaling", scaling)))
        for what, change in variants:
            checks.append((what, lambda change=change: [
                setattr(b.mlp, "m", MoeCfg(**{**vars(moe), **change}))
                for b in model.layers if hasattr(b.mlp, "m")], None))
        for what, change, undo in checks:
            if not must_fail(what, change, undo):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
