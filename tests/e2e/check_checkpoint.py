#!/usr/bin/python3
"""Checkpoints end to end, on one rank (the layout changes are tests/mpi/checkpoint_reshard.py).

  resume     stop after step 5 with a checkpoint, resume to step 10: every step's loss and grad
             norm bitwise equal to the uninterrupted run (fp32, bf16, fp16 whose loss scale must
             be restored, and fp32 with background saves); keep_last prunes; metrics.jsonl
             keeps one line per step
  reader     an independent reader (h5py) gets, through index.h5, the tensors --dump-final wrote;
             h5dump reads one too; inspect and verify report them
  kill       SIGKILL at random moments of a run that saves every step, until some kills land in
             the middle of a save: `latest` must then name a complete checkpoint that verifies
             and resumes, and the next run removes the leftover temporary directory
  corrupt    a truncated rank file and a flipped byte inside a tensor's data are refused by the
             manifest before parsing, and (manifest deleted) reported by
             `verify` and by load, naming the file and the dataset
  errors     load = "latest" with nothing saved, and a checkpoint of another model shape (which
             lists each tensor with both shapes) fail with exit code 2 before training
  chunkindex a bit flipped in a rank file's chunk index (a v1 B-tree key, not the data), which
             h5py reads back as the fill value without an error: `verify` and a resume stop
             naming the file, the dataset and the tensor (each box's xxh64 checksum)
  fuzz       a two-rank checkpoint (resharded from the run's) and N seeded random damages over
             all its files (a byte flipped, a file truncated, extended, deleted, or two files
             swapped): `checkpoint verify` (address space capped at 2 GiB, 60 s) must refuse
             each (exit 1, or 2 once no index.h5 is left) or, the manifest alone deleted, read
             it back unchanged; never crash; a sample of resumes must refuse too;
             the seed is printed (LLMT_FUZZ_SEED reruns one)
  states     the optimizer states are whatever the index lists: a checkpoint whose index keeps
             one optimizer state under another name ("momentum", mapped to exp_avg_sq's boxes)
             verifies, inspects and reshards to dp=2 with that state (h5py reads it back equal),
             and a run, whose AdamW keeps exp_avg and exp_avg_sq, refuses it naming both lists
  memory     with LLMTRAIN_MEMORY_AVAILABLE=1000, verify, inspect, reshard and export exit 2
             before reading a tensor, naming the bytes their buffers need (verify: the largest
             box, wte) and what decides it; with --force they run"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

FAILURES = []


def check(ok, msg):
    if not ok:
        FAILURES.append(msg)


def run(cmd, expect=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       errors="backslashreplace")
    if expect is not None and r.returncode != expect:
        sys.exit(f"FAIL: exit {r.returncode} (expected {expect}): {' '.join(cmd)}\n{r.stdout}")
    return r


class Runner:
    def __init__(self, args):
        self.args = args

    def train(self, run_dir, *sets, extra=(), expect=0, fresh=True):
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [self.args.llmtrain, "train", "--config", self.args.config, *extra,
               "--set", f"train.run_dir={run_dir}", "--set", "log.progress=false"]
        for s in sets:
            cmd += ["--set", s]
        return run(cmd, expect)

    def metrics(self, run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]


def test_resume(r, w):
    for precision in ["fp32", "bf16", "fp16", "fp32-async"]:
        sets = [f"train.precision={precision.split('-')[0]}"]
        if precision.endswith("async"):  # written in the background, completed at later steps
            sets += ["checkpoint.async=true"]
        if precision == "fp16":  # a scale that overflows first: the scaler state matters
            sets += ["optimizer.initial_loss_scale=1e10", "optimizer.loss_scale_window=3"]
        full, part = os.path.join(w, f"full_{precision}"), os.path.join(w, f"part_{precision}")
        ck = os.path.join(part, "ckpt")
        r.train(full, *sets)
        r.train(part, *sets, f"checkpoint.dir={ck}", "checkpoint.interval=2",
                "checkpoint.keep_last=2", extra=["--stop-after-steps", "5"])
        steps = sorted(d for d in os.listdir(ck) if d.startswith("step_"))
        check(steps == ["step_00000004", "step_00000005"],
              f"{precision}: keep_last=2 left {steps}")
        check(open(os.path.join(ck, "latest")).read().strip() == "step_00000005",
              f"{precision}: latest is not step 5")
        out = r.train(part, *sets, f"checkpoint.dir={ck}", "checkpoint.load=latest",
                      fresh=False).stdout
        check("resumed from" in out, f"{precision}: no 'resumed from' line:\n{out}")
        a, b = r.metrics(full), r.metrics(part)
        check([m["step"] for m in b] == list(range(1, 11)),
              f"{precision}: metrics steps {[m['step'] for m in b]}")
        for x, y in zip(a, b):
            for key in ["loss", "grad_norm", "loss_scale", "lr"]:
                check(x[key] == y[key], f"{precision} step {x['step']} {key}: {y[key]!r} "
                      f"resumed vs {x[key]!r} uninterrupted (must be bitwise equal)")
        if precision == "fp16":
            check(any(m["skipped"] for m in a), "fp16: no step was skipped; the test is too weak")
        print(f"resume {precision}: 10 steps bitwise equal after resuming at step 5")


def test_reader(r, w):
    run_dir = os.path.join(w, "reader")
    ck = os.path.join(run_dir, "ckpt")
    r.train(run_dir, f"checkpoint.dir={ck}", "train.steps=3",
            extra=["--dump-final", os.path.join(run_dir, "final")])
    step = os.path.join(ck, "step_00000003")
    meta = json.load(open(os.path.join(run_dir, "final", "params.json")))["params"]
    flat = np.fromfile(os.path.join(run_dir, "final", "params.bin"), dtype="<f4")
    with h5py.File(os.path.join(step, "index.h5"), "r") as f:
        check(f.attrs["format"] == "llmtrain-checkpoint" and f.attrs["step"] == 3,
              f"index attributes {dict(f.attrs)}")
        for p in meta:
            n = int(np.prod(p["shape"]))
            want = flat[p["offset"]:p["offset"] + n].reshape(p["shape"])
            got = f["model/" + p["name"]][()]
            check(got.shape == want.shape and np.array_equal(got, want),
                  f"h5py model/{p['name']} differs from --dump-final")
            for k in ["exp_avg", "exp_avg_sq"]:
                m = f[f"optimizer/{k}/" + p["name"]][()]
                check(m.shape == want.shape and np.all(np.isfinite(m)),
                      f"optimizer/{k}/{p['name']}: shape {m.shape} or non-finite values")
        wte = f["model/wte.weight"][()]
    dump = run(["h5dump", "-d", "/model/wte.weight", "-s", "0,0", "-c", "1,4",
                os.path.join(step, "index.h5")]).stdout
    first = [float(x) for x in re.findall(r"\(0,0\): ([^\n]*)", dump)[0].split(",")]
    check(np.allclose(first, wte[0, :4], rtol=1e-6), f"h5dump wte[0,:4] {first} vs {wte[0, :4]}")
    out = run([r.args.llmtrain, "checkpoint", "inspect", ck]).stdout
    check("step 3" in out and re.search(r"model/wte.weight +\(256, 64\) +f32", out),
          f"inspect output:\n{out}")
    out = run([r.args.llmtrain, "checkpoint", "verify", ck]).stdout
    check(": ok:" in out, f"verify output:\n{out}")
    print(f"reader: {len(meta)} tensors read by h5py equal --dump-final; h5dump, inspect, verify")


def test_kill(r, w):
    """Random SIGKILLs of a run saving every step of a larger model (saves are most of the time)."""
    run_dir = os.path.join(w, "kill")
    ck = os.path.join(run_dir, "ckpt")
    shutil.rmtree(run_dir, ignore_errors=True)
    big = ["model.d_model=256", "model.n_layers=4", "model.vocab_size=4096",
           "train.global_batch_size=2", "train.micro_batch_size=2", "train.steps=1000",
           f"checkpoint.dir={ck}", "checkpoint.interval=1", "checkpoint.keep_last=2",
           "checkpoint.load=auto", f"train.run_dir={run_dir}", "log.progress=false"]
    cmd = [r.args.llmtrain, "train", "--config", r.args.config]
    for s in big:
        cmd += ["--set", s]
    rng = random.Random(1)
    hits, trials, last_step = 0, 0, 0
    while hits < 2 and trials < 25:
        trials += 1
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(rng.uniform(0.8, 2.5))
        p.send_signal(signal.SIGKILL)
        p.communicate()
        leftovers = [d for d in os.listdir(ck) if d.startswith(".tmp.")] if os.path.isdir(ck) else []
        if not os.path.exists(os.path.join(ck, "latest")):
            continue  # killed before the first save finished: nothing to resume yet
        hits += bool(leftovers)
        latest = open(os.path.join(ck, "latest")).read().strip()
        v = run([r.args.llmtrain, "checkpoint", "verify", ck], expect=None)
        check(v.returncode == 0, f"trial {trials}: latest={latest} does not verify:\n{v.stdout}")
        step = int(latest.split("_")[1])
        check(step >= last_step, f"trial {trials}: latest went back from {last_step} to {step}")
        last_step = step
    check(hits >= 2, f"only {hits} of {trials} kills landed inside a save; cannot judge atomicity")
    # The next run reports and removes the leftovers, resumes from latest and trains on.
    out = run(cmd[:4] + sum([["--set", s] for s in big], []) +
              ["--stop-after-steps", str(last_step + 1)]).stdout
    check(not [d for d in os.listdir(ck) if d.startswith(".tmp.")], "leftovers not removed")
    check(f"resumed from {os.path.join(ck, f'step_{last_step:08d}')}" in out,
          f"did not resume from step {last_step}:\n{out}")
    print(f"kill: {trials} SIGKILLs, {hits} inside a save; latest always verified and resumed "
          f"(last at step {last_step})")


def test_corrupt(r, w):
    run_dir = os.path.join(w, "corrupt")
    ck = os.path.join(run_dir, "ckpt")
    r.train(run_dir, f"checkpoint.dir={ck}", "train.steps=2")
    step = os.path.join(ck, "step_00000002")

    # A flipped byte inside the data of model/layers.1.mlp.fc1.weight's box.
    flipped = os.path.join(w, "flipped")
    shutil.rmtree(flipped, ignore_errors=True)
    shutil.copytree(step, flipped)
    shard = os.path.join(flipped, "rank_00000.h5")
    with h5py.File(shard, "r") as f:
        ds = "model/layers.1.mlp.fc1.weight/0"
        info = f[ds].id.get_chunk_info(0)
    with open(shard, "r+b") as f:
        f.seek(info.byte_offset + 100)
        b = f.read(1)
        f.seek(info.byte_offset + 100)
        f.write(bytes([b[0] ^ 0x10]))
    # The manifest refuses the file before HDF5 parses it; without the manifest (a checkpoint
    # written before manifests) the chunk's Fletcher32 names the dataset.
    v = run([r.args.llmtrain, "checkpoint", "verify", flipped], expect=1).stdout
    check("rank_00000.h5 differs from the manifest" in v,
          f"verify of a flipped byte does not name the file and the manifest:\n{v}")
    t = r.train(os.path.join(w, "load_flipped_m"), "checkpoint.load=" + flipped, "train.steps=3",
                expect=1).stdout
    check("rank_00000.h5 differs from the manifest" in t, f"load of a flipped byte:\n{t}")
    os.remove(os.path.join(flipped, "manifest.json"))
    v = run([r.args.llmtrain, "checkpoint", "verify", flipped], expect=1).stdout
    check("rank_00000.h5" in v and ds in v and "fletcher32" in v.lower() and
          "no manifest" not in v,
          f"verify of a flipped byte does not name file, dataset and checksum:\n{v}")
    t = r.train(os.path.join(w, "load_flipped"), "checkpoint.load=" + flipped, "train.steps=3",
                expect=1).stdout
    check("rank_00000.h5" in t and ds in t, f"load of a flipped byte:\n{t}")

    # A truncated rank file.
    cut = os.path.join(w, "truncated")
    shutil.rmtree(cut, ignore_errors=True)
    shutil.copytree(step, cut)
    shard = os.path.join(cut, "rank_00000.h5")
    os.truncate(shard, os.path.getsize(shard) // 2)
    v = run([r.args.llmtrain, "checkpoint", "verify", cut], expect=1).stdout
    check("rank_00000.h5" in v, f"verify of a truncated file does not name it:\n{v}")
    t = r.train(os.path.join(w, "load_cut"), "checkpoint.load=" + cut, "train.steps=3",
                expect=1).stdout
    check("rank_00000.h5" in t, f"load of a truncated file does not name it:\n{t}")
    # A missing rank file: the index alone would read NaN; verify and load must refuse.
    os.remove(shard)
    v = run([r.args.llmtrain, "checkpoint", "verify", cut], expect=1).stdout
    check("rank_00000.h5 is missing" in v, f"verify of a missing rank file:\n{v}")
    print("corrupt: flipped byte, truncated and missing rank files named by verify and load")


def test_errors(r, w):
    empty = os.path.join(w, "empty_ckpt")
    shutil.rmtree(empty, ignore_errors=True)
    t = r.train(os.path.join(w, "no_latest"), f"checkpoint.dir={empty}",
                "checkpoint.load=latest", expect=2).stdout
    check(empty in t and "no complete checkpoint" in t, f"load=latest with nothing saved:\n{t}")
    run_dir = os.path.join(w, "shape")
    ck = os.path.join(run_dir, "ckpt")
    r.train(run_dir, f"checkpoint.dir={ck}", "train.steps=3")
    t = r.train(os.path.join(w, "shape_b"), f"checkpoint.load={ck}", "model.d_ff=128",
                expect=2).stdout
    check(re.search(r"model/layers\.0\.mlp\.fc1\.weight: the checkpoint has shape \(\d+, 64\), "
                    r"the model expects \(128, 64\)", t) is not None,
          f"shape mismatch message:\n{t}")
    print("errors: load=latest without a checkpoint and another model shape exit 2")


def test_memory(r, w):
    run_dir = os.path.join(w, "mem")
    ck = os.path.join(run_dir, "ckpt")
    r.train(run_dir, f"checkpoint.dir={ck}", "train.steps=2")
    llm = r.args.llmtrain
    # The model's largest tensor: wte (vocab x d_model) f32, read whole for its checksum.
    with h5py.File(os.path.join(ck, "step_00000002", "index.h5"), "r") as f:
        wte = f["model/wte.weight"].shape
    box = wte[0] * wte[1] * 4
    cases = {
        "verify": ([ck], box, r"the largest box, model/wte\.weight"),
        "inspect": ([ck], 2 * box, r"read twice over"),
        "reshard": ([ck, os.path.join(w, "resharded")], None, r"the largest box written"),
        "export": ([ck, os.path.join(w, "hf"), "--tokenizer", "none"], None,
                   r"the largest tensor written"),
    }
    for cmd, (rest, need, what) in cases.items():
        for d in rest[1:2]:
            shutil.rmtree(d, ignore_errors=True)
        env = {**os.environ, "LLMTRAIN_MEMORY_AVAILABLE": "1000"}
        p = subprocess.run([llm, "checkpoint", cmd, *rest], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        m = re.search(rf"checkpoint {cmd} needs [0-9.]+ \w+ \((\d+) bytes\) for its buffers \(.*"
                      rf"{what}.*\), more than the [0-9.e-]+ \w+ this machine has left "
                      r"\(LLMTRAIN_MEMORY_AVAILABLE\); .*--force", p.stdout)
        check(p.returncode == 2 and m, f"{cmd} at 1000 bytes: exit {p.returncode}:\n{p.stdout}")
        if m and need is not None:
            check(int(m.group(1)) == need, f"{cmd}: needs {m.group(1)} bytes, expected {need}")
        check(all(not os.path.exists(d) for d in rest[1:2]), f"{cmd}: refused but wrote {rest[1:2]}")
        p = subprocess.run([llm, "checkpoint", cmd, *rest, "--force"], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        check(p.returncode == 0, f"{cmd} --force: exit {p.returncode}:\n{p.stdout}")
    print(f"memory: verify, inspect, reshard and export refused at 1000 bytes left (exit 2, the "
          f"bytes and the box named; verify {box} bytes = wte {wte} f32), run with --force")


def datasets_of(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset)
                     else None)
    return out


def test_chunkindex(r, w):
    run_dir = os.path.join(w, "chunkindex")
    ck = os.path.join(run_dir, "ckpt")
    r.train(run_dir, f"checkpoint.dir={ck}", "train.steps=2")
    step = os.path.join(ck, "step_00000002")
    rank_file = os.path.join(step, "rank_00000.h5")
    with h5py.File(rank_file, "r") as f:
        unsummed = []
        f.visititems(lambda n, o: unsummed.append(n) if isinstance(o, h5py.Dataset) and
                     "xxh64" not in o.attrs else None)
    check(not unsummed, f"rank-file datasets without their xxh64 attribute: {unsummed}")
    good = datasets_of(rank_file)
    data = bytearray(open(rank_file, "rb").read())
    hit = None
    # v1 B-tree nodes: "TREE", type, level, entries (2), siblings (2 x 8), then per entry a key
    # (chunk size 4, filter mask 4, one 8-byte offset per dim + 1) and a child address (8).
    for at in [m.start() for m in re.finditer(b"TREE", data)]:
        if data[at + 4] != 1 or data[at + 5] != 0:
            continue  # not a leaf of a chunked dataset's index
        bad = bytearray(data)
        bad[at + 24 + 8 + 7] ^= 0x40  # the first key's dim-0 offset: a chunk nobody asks for
        trial = os.path.join(run_dir, "trial.h5")
        open(trial, "wb").write(bad)
        try:
            got = datasets_of(trial)
        except Exception:  # noqa: BLE001 - HDF5 noticed: not the silent case
            continue
        changed = [n for n in good if not np.array_equal(got[n], good[n])]
        if changed:
            hit = (bad, changed[0])
            break
    check(hit is not None, "no chunk-index flip found that h5py reads back silently")
    if not hit:
        return
    bad, name = hit
    corrupt = os.path.join(run_dir, "corrupt")
    shutil.rmtree(corrupt, ignore_errors=True)
    shutil.copytree(step, corrupt)
    open(os.path.join(corrupt, "rank_00000.h5"), "wb").write(bad)
    # (The manifest refuses any changed byte first; this case is about the check behind it.)
    os.remove(os.path.join(corrupt, "manifest.json"))
    v = run([r.args.llmtrain, "checkpoint", "verify", corrupt], expect=1).stdout
    want = f"rank_00000.h5: dataset {name}: the values read do not match the box's checksum"
    check(want in v, f"verify after the flip:\n{v}")
    t = r.train(os.path.join(w, "chunkindex_b"), f"checkpoint.load={corrupt}", expect=1).stdout
    check(want in t and "cannot be trusted" in t, f"resume after the flip:\n{t}")
    print(f"chunkindex: a flipped chunk-index key silently changed {name} for h5py; verify and "
          "load report its checksum mismatch")


def test_states(r, w):
    run_dir = os.path.join(w, "states")
    ck = os.path.join(run_dir, "ckpt")
    r.train(run_dir, f"checkpoint.dir={ck}", "train.steps=2")
    step = os.path.join(ck, "step_00000002")
    other = os.path.join(run_dir, "other")
    shutil.copytree(step, other)
    with h5py.File(os.path.join(other, "index.h5"), "a") as f:
        want = {n: f["optimizer/exp_avg_sq/" + n][()] for n in f["model"]}
        del f["optimizer/exp_avg"]
        f.move("optimizer/exp_avg_sq", "optimizer/momentum")
    # Edited on purpose: its manifest would refuse the index, and is deleted.
    out = run([r.args.llmtrain, "checkpoint", "verify", other], expect=1).stdout
    check("index.h5 differs from the manifest" in out and "manifest.json is deleted" in out,
          f"verify of an edited index with its manifest:\n{out}")
    os.remove(os.path.join(other, "manifest.json"))
    # verify --upgrade writes the manifest of what it verified; the next verify checks it.
    out = run([r.args.llmtrain, "checkpoint", "verify", "--upgrade", other]).stdout
    check("no manifest" in out and "wrote manifest.json" in out, f"verify --upgrade:\n{out}")
    out = run([r.args.llmtrain, "checkpoint", "verify", other]).stdout
    check("as its manifest lists them" in out, f"verify after --upgrade:\n{out}")
    out = run([r.args.llmtrain, "checkpoint", "verify", other]).stdout
    check(": ok:" in out, f"verify of a checkpoint with state momentum:\n{out}")
    out = run([r.args.llmtrain, "checkpoint", "inspect", other]).stdout
    check("optimizer/momentum/wte.weight" in out and "exp_avg" not in out, f"inspect:\n{out}")
    resharded = os.path.join(run_dir, "resharded")
    shutil.rmtree(resharded, ignore_errors=True)
    run([r.args.llmtrain, "checkpoint", "reshard", other, resharded, "--world", "2",
         "--set", "parallel.dp=2"])
    with h5py.File(os.path.join(resharded, "index.h5"), "r") as f:
        check(sorted(f["optimizer"].keys()) == ["momentum"],
              f"resharded optimizer groups {list(f['optimizer'].keys())}")
        for n, v in want.items():
            check(np.array_equal(f["optimizer/momentum/" + n][()], v),
                  f"resharded optimizer/momentum/{n} differs from exp_avg_sq")
    with h5py.File(os.path.join(resharded, "rank_00001.h5"), "r") as f:
        check("momentum" in f["optimizer"], "rank 1 of the resharded checkpoint writes no momentum")
    t = r.train(os.path.join(w, "states_b"), f"checkpoint.load={other}", expect=2).stdout
    check('optimizer/exp_avg/: missing from the checkpoint (this run keeps the state "exp_avg"; '
          'the checkpoint stores "param", "momentum")' in t and
          'optimizer/momentum/: the checkpoint stores the state "momentum", which this run does '
          'not keep (it keeps "param", "exp_avg", "exp_avg_sq")' in t,
          f"resume with other optimizer states:\n{t}")
    print(f"states: a checkpoint keeping state 'momentum' verifies, inspects, reshards "
          f"({len(want)} tensors equal) and is refused by an AdamW run")


def test_fuzz(r, w, cases=300, resumes=12):
    import resource
    seed = int(os.environ.get("LLMT_FUZZ_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    print(f"fuzz: seed {seed} (LLMT_FUZZ_SEED={seed} reruns these cases)")
    run_dir = os.path.join(w, "fuzz")
    ck = os.path.join(run_dir, "ckpt")
    r.train(run_dir, f"checkpoint.dir={ck}", "train.steps=2")
    base = os.path.join(w, "fuzz_base")
    shutil.rmtree(base, ignore_errors=True)
    run([r.args.llmtrain, "checkpoint", "reshard", os.path.join(ck, "step_00000002"), base,
         "--world", "2", "--set", "parallel.dp=2"])
    files = sorted(os.listdir(base))
    check(files == ["index.h5", "manifest.json", "rank_00000.h5", "rank_00001.h5"],
          f"the resharded checkpoint holds {files}")
    original = {f: open(os.path.join(base, f), "rb").read() for f in files}

    def limited():
        cap = 2 << 30
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    def damage(d):
        kind = rng.choice(["flip", "flip", "flip", "truncate", "extend", "delete", "swap"])
        name = rng.choice(files)
        path = os.path.join(d, name)
        data = bytearray(original[name])
        if kind == "flip":
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
            open(path, "wb").write(data)
            return f"flip {name}[{at}]"
        if kind == "truncate":
            n = rng.randrange(len(data))
            open(path, "wb").write(data[:n])
            return f"truncate {name} to {n}"
        if kind == "extend":
            open(path, "ab").write(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
            return f"extend {name}"
        if kind == "delete":
            os.remove(path)
            return f"delete {name}"
        other = rng.choice([f for f in files if f != name])
        a, b = os.path.join(d, name), os.path.join(d, other)
        os.rename(a, a + ".x")
        os.rename(b, a)
        os.rename(a + ".x", b)
        return f"swap {name} {other}"

    d = os.path.join(w, "fuzz_case")
    counts, outcomes = {}, {}
    resumed = 0
    for i in range(cases):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        what = damage(d)
        kind = what.split()[0]
        try:
            p = subprocess.run([r.args.llmtrain, "checkpoint", "verify", d], capture_output=True,
                               timeout=60, preexec_fn=limited)
            code, raw = p.returncode, p.stdout + p.stderr
            out = raw.decode(errors="backslashreplace")
            # Messages quote what they read from damaged files: escaped, never raw bytes.
            check(out.encode() == raw, f"case {i} ({what}): output is not valid UTF-8:\n{out}")
        except subprocess.TimeoutExpired:
            code, out = "timeout", ""
        counts[kind] = counts.get(kind, 0) + 1
        # Refused (1; 2 when no index.h5 is left: not a checkpoint), or read back with nothing
        # changed: the manifest deleted leaves a checkpoint as written before manifests.
        intact = all(os.path.exists(os.path.join(d, f)) and
                     open(os.path.join(d, f), "rb").read() == original[f]
                     for f in files if f != "manifest.json")
        if code == 0 and intact and "no manifest" in out:
            outcomes["read back unchanged"] = outcomes.get("read back unchanged", 0) + 1
            continue
        if code not in (1, 2) or "error:" not in out:
            check(False, f"fuzz case {i} (seed {seed}): {what}: verify exit {code}, expected 1 "
                         f"with an error:\n{out[-2000:]}")
            continue
        outcomes[f"refused (exit {code})"] = outcomes.get(f"refused (exit {code})", 0) + 1
        if resumed < resumes and i % max(1, cases // resumes) == 0:
            resumed += 1
            t = r.train(os.path.join(w, "fuzz_resume"), f"checkpoint.load={d}", "train.steps=3",
                        expect=None)
            check(t.returncode in (1, 2) and "error:" in t.stdout,
                  f"fuzz case {i} (seed {seed}): {what}: resume exit {t.returncode}, expected 1:"
                  f"\n{t.stdout[-2000:]}")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    results = ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
    print(f"fuzz: {cases} damaged copies ({summary}): {results}; address space capped at 2 "
          f"GiB; {resumed} resumes of refused copies refused too")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("check", choices=["resume", "reader", "kill", "corrupt", "errors", "states",
                                          "chunkindex", "fuzz", "memory"])
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    globals()["test_" + args.check](Runner(args), args.workdir)
    if FAILURES:
        sys.exit("FAIL:\n  " + "\n  ".join(FAILURES))
    print("OK")


if __name__ == "__main__":
    main()
