#!/usr/bin/python3
"""`llmtrain checkpoint import` (Hugging Face safetensors -> checkpoint), checked against export:

  roundtrip  GPT-2, Llama (with Llama 3.1's RoPE scaling), Mixtral (the MoE config without shared
             experts or dense layers) and DeepseekV3 (latent attention, a dense layer, shared and
             group-routed experts, a multi-token prediction module, DeepSeek-V3's YaRN):
             config.json's rope_scaling as Hugging Face writes it, and back in the import's config;
             train 2 steps, export, import: every tensor bitwise the checkpoint's; one
             fine-tuning step from the import and from the original checkpoint give bitwise the
             same losses; imported at tp 2 + sp (--world 2 --set parallel.tp=2 ...) it verifies and
             fine-tunes to the same losses
  bf16       the Llama export rewritten as BF16 in two shards with model.safetensors.index.json:
             imported and exported again, each tensor is its BF16 rounding (nearest even), exactly
  gpt2model  the GPT-2 export under GPT2Model's names (no "transformer." prefix) with the causal
             mask buffers (h.N.attn.bias) beside them: imported bitwise, the buffers ignored
  errors     a rope_scaling type llmtrain lacks ("dynamic"), DeepseekV3 weights with interleaved rope
             dims, a missing tensor and a tensor of another shape are refused naming them"""
import json
import os
import shutil
import struct
import subprocess

import h5py
import numpy as np

from harness import finish, parse_args, run

CONFIGS = {"gpt": "gpt-tiny.toml", "llama": "llama-tiny.toml", "moe": "moe-tiny.toml",
           "mla": "mla-tiny.toml"}
MIXTRAL = ["model.moe.shared_experts=0", "model.moe.first_dense_layers=0"]
# DeepseekV3ForCausalLM: latent attention, a dense first layer, then a shared and 8 routed
# experts (sigmoid scores, 2 of 2 of 4 groups, scaled, the balancing bias).
DEEPSEEK_V3 = ["model.moe.num_experts=8", "model.moe.top_k=2", "model.moe.d_ff_expert=32",
               "model.moe.router=sigmoid", "model.moe.balance=bias", "model.moe.shared_experts=1",
               "model.moe.n_group=4", "model.moe.topk_group=2",
               "model.moe.routed_scaling_factor=2.5", "model.moe.first_dense_layers=1",
               "model.mtp_depth=1"]
# RoPE scaling as Llama 3.1 and DeepSeek-V3 ship it (on tiny contexts), and what config.json says.
LLAMA3_ROPE = ["model.rope_scaling.rope_type=llama3", "model.rope_scaling.factor=8.0",
               "model.rope_scaling.original_max_position_embeddings=16",
               "model.rope_scaling.low_freq_factor=1.0", "model.rope_scaling.high_freq_factor=4.0"]
YARN_ROPE = ["model.rope_scaling.rope_type=yarn", "model.rope_scaling.factor=40.0",
             "model.rope_scaling.original_max_position_embeddings=16",
             "model.rope_scaling.mscale=1.0", "model.rope_scaling.mscale_all_dim=1.0"]
ROPE_JSON = {
    "llama": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 16},
    "mla": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
}


def read_st(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, in file order."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            a, b = t["data_offsets"]
            out[name] = (t["dtype"], t["shape"], data[a:b])
    return out


def write_st(path, tensors):
    """Writes {name: (dtype, shape, bytes)} as a safetensors file."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, raw in tensors.values():
            f.write(raw)


def bf16(raw):
    """float32 bytes -> (bf16 bytes, the float32 values they stand for), round to nearest even."""
    u = np.frombuffer(raw, dtype="<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return r.tobytes(), (r.astype(np.uint32) << 16).view("<f4")


def model_tensors(ckpt):
    """{name: float32 array} of a checkpoint's master weights, read through its index."""
    with h5py.File(os.path.join(ckpt, "index.h5"), "r") as f:
        out = {}
        f["model"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset)
                              else None)
    return out


def main():
    args = parse_args()
    w = args.workdir
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    cfgdir = os.path.dirname(args.config)
    failures = []

    def train(name, config, sets):
        cmd = [args.llmtrain, "train", "--config", config, "-q", "--set", "train.threads=1",
               "--set", f"train.run_dir={os.path.join(w, name)}"]
        for s in sets:
            cmd += ["--set", s]
        run(cmd)
        with open(os.path.join(w, name, "metrics.jsonl")) as f:
            return [json.loads(line)["loss"] for line in f]

    def tune(name, config, sets, source):
        return train(name, config, sets + ["train.steps=2", "optimizer.warmup_steps=1",
                                           f"checkpoint.init_from={source}"])

    def llmtrain(*a):
        return subprocess.run([args.llmtrain, *a], capture_output=True, text=True)

    for model, file in CONFIGS.items():
        config = os.path.join(cfgdir, file)
        sets = {"moe": MIXTRAL, "mla": DEEPSEEK_V3 + YARN_ROPE, "llama": LLAMA3_ROPE}.get(model, [])
        ck = os.path.join(w, model + "_ck")
        train(model, config, sets + ["train.steps=2", f"checkpoint.dir={ck}"])
        hf, imp, imp2 = (os.path.join(w, model + s) for s in ("_hf", "_imp", "_imp_tp2"))
        run([args.llmtrain, "checkpoint", "export", ck, hf])
        out = run([args.llmtrain, "checkpoint", "import", hf, imp])
        print(out.strip().splitlines()[-1][:160])
        with open(os.path.join(hf, "config.json")) as f:
            rope = json.load(f).get("rope_scaling")
        with h5py.File(os.path.join(imp, "index.h5"), "r") as f:
            stored = f.attrs["config"]
            stored = stored.decode() if isinstance(stored, bytes) else stored
        if rope != ROPE_JSON.get(model):
            failures.append(f"{model}: config.json's rope_scaling {rope}, expected {ROPE_JSON.get(model)}")
        for s in sets:
            key, value = s.split("=", 1)
            text = value if value.replace(".", "").isdigit() else json.dumps(value)
            if key.startswith("model.rope_scaling.") and \
                    f"\n{key.rsplit('.', 1)[1]} = {text}\n" not in stored:
                failures.append(f"{model}: the import's config lacks {s}")
        orig = model_tensors(os.path.join(ck, "step_00000002"))
        got = model_tensors(imp)
        differ = [n for n in orig if n not in got or orig[n].tobytes() != got[n].tobytes()]
        if differ or set(got) != set(orig):
            failures.append(f"{model}: import(export) differs in {differ or set(got) ^ set(orig)}")
        run([args.llmtrain, "checkpoint", "import", hf, imp2, "--world", "2", "--set",
             "parallel.tp=2", "--set", "parallel.sequence_parallel=true"])
        v = llmtrain("checkpoint", "verify", imp2)
        if v.returncode != 0 or "over 2 rank files" not in v.stdout:
            failures.append(f"{model}: the tp2 import does not verify:\n{v.stdout}{v.stderr}")
        a = tune(model + "_tune_orig", config, sets, ck)
        b = tune(model + "_tune_imp", config, sets, imp)
        c = tune(model + "_tune_imp_tp2", config, sets, imp2)
        print(f"{model}: {len(orig)} tensors bitwise; fine-tuning losses {a} from the checkpoint, "
              f"{b} from its import, {c} from the tp2 import")
        if not (a == b == c):
            failures.append(f"{model}: fine-tuning losses {a} / {b} / {c} differ")

    # BF16 in two shards with an index.
    src = read_st(os.path.join(w, "llama_hf", "model.safetensors"))
    sharded = os.path.join(w, "llama_bf16")
    os.makedirs(sharded)
    shutil.copy(os.path.join(w, "llama_hf", "config.json"), sharded)
    names = list(src)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    expect, weight_map = {}, {}
    for shard, part in halves.items():
        tensors = {}
        for n in part:
            dtype, shape, raw = src[n]
            b, value = bf16(raw)
            tensors[n] = ("BF16", shape, b)
            expect[n] = value.reshape(shape)
            weight_map[n] = shard
        write_st(os.path.join(sharded, shard), tensors)
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    out = run([args.llmtrain, "checkpoint", "import", sharded, os.path.join(w, "llama_bf16_imp")])
    # Exported again, every tensor must be its BF16 rounding (as float32), exactly.
    run([args.llmtrain, "checkpoint", "export", os.path.join(w, "llama_bf16_imp"),
         os.path.join(w, "llama_bf16_again"), "--tokenizer", "none"])
    again = read_st(os.path.join(w, "llama_bf16_again", "model.safetensors"))
    bad = [n for n in expect if n not in again
           or np.frombuffer(again[n][2], dtype="<f4").tobytes() != expect[n].tobytes()]
    if "BF16" not in out or bad or set(again) != set(expect):
        failures.append(f"bf16 shards: {bad} differ from their BF16 values\n{out}")
    print(f"bf16: two shards, all {len(expect)} tensors imported as their BF16 rounding exactly")

    # GPT2Model names and mask buffers.
    g = read_st(os.path.join(w, "gpt_hf", "model.safetensors"))
    plain = os.path.join(w, "gpt2model")
    os.makedirs(plain)
    shutil.copy(os.path.join(w, "gpt_hf", "config.json"), plain)
    renamed = {n.removeprefix("transformer."): t for n, t in g.items()}
    mask = np.tril(np.ones((32, 32), dtype="<f4")).tobytes()
    renamed["h.0.attn.bias"] = ("F32", [1, 1, 32, 32], mask)
    write_st(os.path.join(plain, "model.safetensors"), renamed)
    r = llmtrain("checkpoint", "import", plain, os.path.join(w, "gpt2model_imp"))
    got = model_tensors(os.path.join(w, "gpt2model_imp")) if r.returncode == 0 else {}
    orig = model_tensors(os.path.join(w, "gpt_ck", "step_00000002"))
    if r.returncode != 0 or any(orig[n].tobytes() != got.get(n, b"").tobytes() for n in orig) \
            or "warning" in r.stderr:
        failures.append(f"GPT2Model names: exit {r.returncode}\n{r.stdout}{r.stderr}")
    print("gpt2model: imported bitwise, the mask buffer ignored")

    # Errors.
    bad_cfg = os.path.join(w, "rope_scaling")
    shutil.copytree(os.path.join(w, "llama_hf"), bad_cfg)
    with open(os.path.join(bad_cfg, "config.json")) as f:
        c = json.load(f)
    c["rope_scaling"] = {"rope_type": "dynamic", "factor": 8.0}
    with open(os.path.join(bad_cfg, "config.json"), "w") as f:
        json.dump(c, f)
    missing = os.path.join(w, "missing")
    os.makedirs(missing)
    shutil.copy(os.path.join(w, "llama_hf", "config.json"), missing)
    write_st(os.path.join(missing, "model.safetensors"),
             {n: t for n, t in src.items() if n != "model.norm.weight"})
    interleaved = os.path.join(w, "rope_interleave")
    shutil.copytree(os.path.join(w, "mla_hf"), interleaved)
    with open(os.path.join(interleaved, "config.json")) as f:
        c = json.load(f)
    del c["rope_interleave"]  # transformers' default: true, DeepSeek's released layout
    with open(os.path.join(interleaved, "config.json"), "w") as f:
        json.dump(c, f)
    shape = os.path.join(w, "shape")
    os.makedirs(shape)
    with open(os.path.join(w, "llama_hf", "config.json")) as f:
        c = json.load(f)
    c["intermediate_size"] += 8
    with open(os.path.join(shape, "config.json"), "w") as f:
        json.dump(c, f)
    shutil.copy(os.path.join(w, "llama_hf", "model.safetensors"), shape)
    for name, d, code, want in [("rope_scaling", bad_cfg, 2, 'rope_scaling.rope_type "dynamic"'),
                                ("rope_interleave", interleaved, 2, "rope_interleave true"),
                                ("missing", missing, 1, "model.norm.weight: missing"),
                                ("shape", shape, 1, "mlp.gate_proj.weight: shape")]:
        r = llmtrain("checkpoint", "import", d, os.path.join(w, name + "_out"))
        print(f"{name}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1][:150]}")
        if r.returncode != code or want not in r.stderr or os.path.exists(
                os.path.join(w, name + "_out")):
            failures.append(f"{name}: exit {r.returncode}, expected {code} naming {want!r}:\n"
                            f"{r.stderr}")
    finish(failures)


if __name__ == "__main__":
    main()
