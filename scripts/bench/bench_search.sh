#!/usr/bin/env bash
# `llmtrain plan --search` against measurement on this machine: the search's top 5 layouts and 3
# random other fitting ones (seeded) of a small GPT-2 shape, each trained under mpirun for a few
# steps; prints predicted and measured step time side by side, how far the search's top pick is
# from the fastest measured, and the Spearman correlation of the predicted ranking with the
# measured one. The cost model's cpu profile detects this CPU's peak; its bandwidths are the
# profile file's (configs/hardware/cpu.toml), not measured. Steps 1-2 are warm-up; a run's figure
# is the median step time of the rest.
#
#   scripts/bench/bench_search.sh LLMTRAIN_BINARY [STEPS] [WORLD...]   (default worlds: 2 4)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
shift $(($# < 2 ? $# : 2))
worlds=("${@:-2 4}")

# GPT-2 shape, 4 layers, d_model 256, 8 heads, 16 x 256 tokens per step.
bench_config 2048 256 8 256 16

/usr/bin/python3 - "$llmtrain" "$work" "$(dirname "${BASH_SOURCE[0]}")" ${worlds[*]} <<'PY'
import json, os, random, shutil, statistics, subprocess, sys
sys.path.insert(0, sys.argv[3])
from runs import conditions
llmtrain, work, worlds = sys.argv[1], sys.argv[2], [int(w) for w in sys.argv[4:]]
config = os.path.join(work, "bench.toml")
env = dict(os.environ, OMP_NUM_THREADS="1")


def ranks_of(sets):
    return [v for s in sets for v in ("--set", s)]


def measure(world, sets, name):
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)  # a fresh run (an earlier one would be refused)
    cmd = [llmtrain, "train", "--config", config, "-q", "--set", f"train.run_dir={out}"] + \
        ranks_of(sets)
    if world > 1:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world)] + cmd
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][2:]
    return statistics.median(r["step_time_s"] for r in rows)


def spearman(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0] * len(x)
        for k, i in enumerate(order):
            r[i] = k
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


print(conditions())
for world in worlds:
    found = json.loads(subprocess.run(
        [llmtrain, "plan", "--config", config, "--search", "--world", str(world), "--hardware",
         "cpu", "--top", "500", "--json"], check=True, capture_output=True, text=True).stdout)
    ranked = found["ranked"]
    picks = ranked[:5]
    rest = ranked[5:]
    picks += random.Random(world).sample(rest, min(3, len(rest)))
    print(f"\nworld {world}: {found['valid']} valid layouts, {found['fitting']} fit; measured "
          f"{len(picks)} (the top 5 and {len(picks) - min(5, len(ranked))} random others)")
    print(f"{'#':>4} {'predicted s':>11} {'measured s':>10}  layout")
    pred, meas = [], []
    for i, c in enumerate(picks):
        t = measure(world, c["sets"], f"w{world}_{i}")
        pred.append(c["step_s"])
        meas.append(t)
        rank = ranked.index(c) + 1
        print(f"{rank:>4} {c['step_s']:>11.4f} {t:>10.4f}  {c['layout']}")
    best = min(meas)
    print(f"world {world}: the search's top pick measured {meas[0]:.4f} s, the fastest measured "
          f"{best:.4f} s ({meas[0] / best:.3f}x); Spearman(predicted, measured) = "
          f"{spearman(pred, meas):+.3f} over {len(picks)} layouts")
PY
