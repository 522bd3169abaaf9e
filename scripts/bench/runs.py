"""Reading bench_run's results (scripts/bench/common.sh), shared by bench_dp.sh, bench_tp.sh and
bench_pp.sh: each run's medians over steps 3.. of metrics.jsonl, the fastest of a name's repeats
(with the least CPU time of them), and the line saying under what conditions it all ran; for the
numerics benchmarks (bench_fp8.sh, bench_zeropp.sh) each run's drift from a baseline run."""
import json
import os
import statistics


def load_one(path, keys, extra=None):
    """Medians of `keys` over steps 3.. of the run in `path`, its CPU seconds (user + sys of all
    ranks) and whatever extra(rows) adds."""
    with open(os.path.join(path, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][2:]
    m = {k: statistics.median(r.get(k, 0) for r in rows) for k in keys}
    with open(path + ".cpu") as f:
        m["cpu_s"] = sum(float(x) for x in f.read().split()[-2:])
    if extra:
        m.update(extra(rows))
    return m


def load(work, name, keys, extra=None):
    """The fastest repeat of run `name` (directories NAME.i in `work`); CPU time: the least."""
    runs = [load_one(os.path.join(work, d), keys, extra) for d in os.listdir(work)
            if d.split(".")[0] == name and not d.endswith(".cpu")]
    best = max(runs, key=lambda m: m["tokens_per_s"])
    best["cpu_s"] = min(m["cpu_s"] for m in runs)
    return best


def conditions():
    return (f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, median of steps 3.., "
            f"best run")


def drift(work, names):
    """{name: figures} of the runs `names` in `work` against the first: the final loss and
    validation loss, the largest per-step |loss difference| and relative difference, the last 10
    steps' mean loss relative to the baseline's, tokens/s (median over steps 3..) and its ratio,
    and the last metrics row."""
    runs = {}
    for name in names:
        with open(os.path.join(work, name, "metrics.jsonl")) as f:
            runs[name] = [json.loads(line) for line in f]
    base = runs[names[0]]
    tps0 = statistics.median(r["tokens_per_s"] for r in base[2:])
    out = {}
    for name, rows in runs.items():
        val = [r["val_loss"] for r in rows if "val_loss" in r]
        tps = statistics.median(r["tokens_per_s"] for r in rows[2:])
        out[name] = {
            "loss": rows[-1]["loss"], "val_loss": val[-1] if val else float("nan"),
            "max_d": max(abs(a["loss"] - b["loss"]) for a, b in zip(rows, base)),
            "max_rel": max(abs(a["loss"] / b["loss"] - 1) for a, b in zip(rows, base)),
            "last10": sum(r["loss"] for r in rows[-10:]) / sum(r["loss"] for r in base[-10:]) - 1,
            "tokens_per_s": tps, "speed": tps / tps0, "last": rows[-1]}
    return out
