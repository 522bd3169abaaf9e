"""End-to-end checks of `llmtrain plan --schedule` on the quickstart config with pp=4: the
printed action lists, bubble fractions and peak in-flight micro-batches of each schedule, the SVG
timeline (parsed as XML, one box per compute action), that a 1.5B-parameter config is planned
without allocating it, and the exit-2 errors of impossible shapes. Run by ctest; see --help."""
import argparse
import json
import pathlib
import re
import resource
import subprocess
import sys
import xml.etree.ElementTree as ET


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)
    print("ok:", msg)


def plan(args, *sets, schedule=True, svg=None, expect_rc=0, extra=()):
    cmd = [args.llmtrain, "plan", "--config", str(args.config), *extra]
    for s in sets:
        cmd += ["--set", s]
    if schedule:
        cmd.append("--schedule")
    if svg:
        cmd += ["--svg", str(svg)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != expect_rc:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {proc.returncode}, expected {expect_rc}\n"
                 f"{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def line_with(out, prefix):
    for line in out.splitlines():
        if line.strip().startswith(prefix):
            return line.strip()
    sys.exit(f"FAIL: no line starting with {prefix!r} in:\n{out}")


def svg_boxes(path):
    root = ET.parse(path).getroot()  # raises on malformed XML
    ns = "{http://www.w3.org/2000/svg}"
    check(root.tag == ns + "svg", f"{path.name}: root element is <svg>")
    return [g.find(ns + "title").text for g in root.iter(ns + "g")]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--config", required=True, type=pathlib.Path)
    ap.add_argument("--workdir", required=True, type=pathlib.Path)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    # quickstart: 4 layers, global_batch_size 16; micro_batch_size 2 gives m = 8 micro-batches.
    base = ["parallel.pp=4", "train.micro_batch_size=2"]

    svg = args.workdir / "1f1b.svg"
    out = plan(args, *base, svg=svg)
    check("micro-batches per step m = 16 / (2 * dp 1) = 8" in out, "m = 8 from the batch sizes")
    check(line_with(out, "rank 3: stage 3") == "rank 3: stage 3 layers 3-3 + head and loss",
          "stage 3 holds layer 3 and the head")
    check(line_with(out, "rank 0: F") ==
          "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7", "1f1b rank 0 actions")
    check(line_with(out, "rank 3: F") ==
          "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7", "1f1b rank 3 actions")
    check("simulated 0.3750, formula (p-1)/m = 0.3750" in out, "1f1b bubble 3/8")
    check("peak in-flight micro-batches per rank: 4 3 2 1 (formula 4 3 2 1)" in out,
          "1f1b peak in-flight p - rank")
    boxes = svg_boxes(svg)
    check(len(boxes) == 2 * 4 * 8, f"1f1b SVG: 64 boxes (got {len(boxes)})")
    check(boxes[0] == "F mb 0 chunk 0: 0.00-1.00", f"first box is F0 at t=0 ({boxes[0]})")

    out = plan(args, *base, "parallel.pp_schedule=gpipe")
    check("simulated 0.3750, formula (p-1)/m = 0.3750" in out, "gpipe bubble 3/8")
    check("per rank: 8 8 8 8 (formula 8 8 8 8)" in out, "gpipe holds all m micro-batches")

    svg = args.workdir / "zb-h1.svg"
    out = plan(args, *base, "parallel.pp_schedule=zb-h1", svg=svg)
    check("simulated 0.1250, formula (p-1)/(3m) = 0.1250" in out, "zb-h1 bubble 3/24")
    check("per rank: 4 4 4 4 (formula 4 4 4 4)" in out, "zb-h1 peak = 1f1b's first stage")
    boxes = svg_boxes(svg)
    check(len(boxes) == 3 * 4 * 8, f"zb-h1 SVG: 96 boxes (got {len(boxes)})")
    check(sum(b.startswith("Bw ") for b in boxes) == 32, "zb-h1 SVG: 32 weight-gradient boxes")

    svg = args.workdir / "interleaved.svg"
    out = plan(args, *base, "model.n_layers=8", "parallel.pp_schedule=interleaved",
               "parallel.virtual_stages=2", svg=svg)
    check(line_with(out, "rank 1: stage 1") ==
          "rank 1: stage 1 layers 1-1; stage 5 layers 5-5", "interleaved: rank 1 holds stages 1, 5")
    check(line_with(out, "rank 0: F").startswith("rank 0: F0.0 F1.0 F2.0 F3.0 F0.1"),
          "interleaved actions carry the chunk")
    check("simulated 0.1875, formula (p-1)/(v*m) = 0.1875" in out, "interleaved bubble 3/16")
    check(len(svg_boxes(svg)) == 2 * 4 * 8 * 2, "interleaved SVG: 128 boxes")

    svg = args.workdir / "dualpipev.svg"
    out = plan(args, *base, "model.n_layers=8", "parallel.pp_schedule=dualpipev",
               "parallel.virtual_stages=2", svg=svg)
    check(line_with(out, "rank 0: stage 0") ==
          "rank 0: stage 0 layers 0-0 + embeddings; stage 7 layers 7-7 + head and loss",
          "dualpipev: rank 0 holds both ends of the V")
    check("simulated 0.0625, formula (p-1)/(6m)" in out, "dualpipev bubble 3/48 (as ZB-V)")
    check("per rank: 9 9 9 9 (formula 9 9 9 9)" in out, "dualpipev peak 2p+1 chunk units")
    check("the most a rank idles is 3.00, DualPipe's (p-1)(F&B+B-3W) = 3.00" in out,
          "dualpipev: pairs timed as blocks idle as DualPipe's table says")
    # Pairs: 2 a steady round (m-2p+r+1 of them) and 1 a round after (p-r-1), 2m-3p+r+1 on rank
    # r, but the last rank's first round: 5 + 6 + 7 + 8 - 1.
    borders = svg.read_text().count('stroke="black"')
    check(borders == 25, f"dualpipev SVG: a border around each F&B pair (got {borders})")
    out = plan(args, *base, "model.n_layers=8", "parallel.pp_schedule=dualpipev",
               "parallel.virtual_stages=2", "parallel.pp_max_deferred=1")
    check("simulated 0.1042" in out and "without parallel.pp_max_deferred = 0.0625" in out,
          "dualpipev deferring one weight half: its simulated bubble, the formula marked uncapped")

    # A 1.5B-parameter model (6 GB in fp32) is planned without allocating it.
    plan(args, "parallel.pp=8", "model.n_layers=48", "model.d_model=1600", "model.n_heads=25",
         "model.vocab_size=50304", "train.micro_batch_size=1")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    check(peak_kb < 200 * 1024, f"plan of a 1.5B model peaks at {peak_kb // 1024} MiB (< 200)")

    out = plan(args, *base, "train.micro_batch_size=16", "model.n_layers=8",
               "parallel.pp_schedule=interleaved", "parallel.virtual_stages=2", expect_rc=2)
    check("train.global_batch_size(16)/(dp(1)*train.micro_batch_size(16))=1, to be divisible "
          "by parallel.pp=4" in out, "interleaved with m=1: exit 2 naming the keys")
    out = plan(args, "parallel.pp=3", expect_rc=2)
    check("model.n_layers=4 does not split evenly into pp(3)" in out, "pp=3: exit 2")
    out = plan(args, "parallel.pp=4", extra=["--world", "6"], expect_rc=2)
    check("world size 6 is not divisible by tp(1)*cp(1)*pp(4)=4" in out,
          "--world 6 with pp=4: exit 2 naming the factors")
    out = plan(args, *base, extra=["--world", "8"])
    check("micro-batches per step m = 16 / (2 * dp 2) = 4" in out, "--world 8: dp 2, m = 4")
    proc = subprocess.run([args.llmtrain, "train", "--config", str(args.config), "--set",
                           "parallel.pp=2"], capture_output=True, text=True)
    check(proc.returncode == 2 and "world size 1 is not divisible by tp(1)*cp(1)*pp(2)=2"
          in proc.stderr, "train with pp=2 on one process: exit 2 naming the factors")

    # ZeRO's whole rows: a mixture-of-experts model's 4-row router over tp 2 x dp 4 leaves 4 of
    # 8 ranks padding only, which plan names (the expert stacks are cut in rows of their experts'
    # first dim, enough for 8 ranks, also with ep 4's one expert per rank); without such a
    # parameter plan says nothing.
    moe = pathlib.Path(__file__).resolve().parent.parent / "mpi" / "configs" / "moe-tiny.toml"
    moe_args = argparse.Namespace(llmtrain=args.llmtrain, config=moe)
    tp_zero = ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.zero_stage=1"]
    out = plan(moe_args, *tp_zero, schedule=False, extra=["--world", "8"])
    check("1 parameter has fewer rows than the ranks sharding them" in out and
          "layers.*.mlp.router.weight (4 rows over 8 ranks)" in out,
          "ZeRO under tp x dp 4: the router named as padded, the expert stacks not")
    out = plan(moe_args, *tp_zero, "parallel.ep=4", schedule=False, extra=["--world", "8"])
    check("1 parameter has fewer rows" in out and "experts" not in out.split("ZeRO shards")[1],
          "with ep 4: one expert per rank, cut in rows of its first dim, is not padded")
    out = plan(moe_args, "parallel.zero_stage=1", schedule=False, extra=["--world", "4"])
    check("ZeRO shards whole rows" not in out, "dp 4 over 4 experts: nothing padded, no note")

    # The cost model: --json, --hardware, --search and its fragment.
    cost = json.loads(plan(args, *base, schedule=False,
                           extra=["--json", "--hardware", "h100-80gb-sxm"]))
    check(cost["hardware"] == "h100-80gb-sxm" and len(cost["stages"]) == 4 and
          0 < cost["mfu"] < 0.75, f"--json: 4 stages, MFU {cost['mfu']:.3g} below the GEMM "
          "efficiency 0.75")
    check(abs(cost["bubble"] - 3 / 8) < 1e-12, "--json: the 1f1b bubble 3/8")
    # The model's size as the text report states it ("parameters: N").
    text = plan(args, *base, schedule=False)
    n = re.search(r"^parameters: (\d+)", text, re.M)
    check(n and cost.get("parameters") == int(n.group(1)) and
          cost.get("active_parameters") == int(n.group(1)),
          f"--json: parameters {cost.get('parameters')} / active "
          f"{cost.get('active_parameters')}, the text report: {n and n.group(1)}")
    moe_cost = json.loads(plan(moe_args, schedule=False, extra=["--json"]))
    check(0 < moe_cost["active_parameters"] < moe_cost["parameters"],
          f"--json of an MoE model: active {moe_cost['active_parameters']} of "
          f"{moe_cost['parameters']} parameters")
    out = plan(args, schedule=False, extra=["--hardware", "h100"], expect_rc=2)
    check("--hardware h100: no such profile" in out and "h100-80gb-sxm" in out,
          "--hardware h100: exit 2 naming the built-in profiles")
    out = plan(args, 'plan.hardware="h100"', schedule=False, expect_rc=2)
    check('plan.hardware = "h100"' in out and "no such profile" in out and "h100-80gb-sxm" in out,
          "[plan] hardware = \"h100\": exit 2 naming the key and the built-in profiles")
    papers = pathlib.Path(args.config).resolve().parent / "papers"
    frag = pathlib.Path(args.workdir).resolve() / "best.toml"
    proc = subprocess.run([args.llmtrain, "plan", "--config", str(papers / "gpt2-1558m.toml"),
                           "--search", "--world", "16", "--hardware", "a100-80gb", "--top", "3",
                           "--write", str(frag)], capture_output=True, text=True)
    check(proc.returncode == 0 and " 1. step " in proc.stdout and " 3. step " in proc.stdout,
          "plan --search prints the top 3")
    # --json: valid JSON whatever the layouts hold (selective recompute's modules print as
    # TOML strings inside the layout text), every candidate, each with its overrides.
    proc = subprocess.run([args.llmtrain, "plan", "--config", args.config, "--search", "--world",
                           "4", "--top", "1000", "--json"], capture_output=True, text=True)
    try:
        ranked = json.loads(proc.stdout)["ranked"]
    except (ValueError, KeyError) as e:
        ranked = []
        print(f"plan --search --json: {e}")
    check(proc.returncode == 0 and ranked and all(r["sets"] for r in ranked) and
          any('["layernorm"' in r["layout"] for r in ranked),
          f"plan --search --json parses ({len(ranked)} candidates, some with recompute modules)")
    cfg = pathlib.Path(args.workdir) / "searched.toml"
    cfg.write_text(f'include = ["{papers / "gpt2-1558m.toml"}", "{frag}"]\n')
    proc = subprocess.run([args.llmtrain, "config", "validate", "--config", str(cfg),
                           "--world", "16"], capture_output=True, text=True)
    check(proc.returncode == 0, f"the written layout validates at world 16\n{proc.stdout}"
          f"{proc.stderr}")


if __name__ == "__main__":
    main()
