"""Reading bench_run's results (scripts/bench/common.sh), shared by bench_dp.sh, bench_tp.sh and
bench_pp.sh: each run's medians over steps 3.. of metrics.jsonl, the fastest of a name's repeats
(with the least CPU time of them), and the line saying under what conditions it all ran."""
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
