"""Shared by the mpirun test scripts (parity.py, volume_memory.py, tp_volume.py): their common
arguments, running a command (failing the test with its output), and the resolved config."""
import argparse
import re
import subprocess
import sys


def parse_args(extra=None):
    """--llmtrain, --mpirun, --config, --workdir; `extra(ap)` adds a script's own arguments."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    if extra:
        extra(ap)
    return ap.parse_args()


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}\n{r.stdout}")
    return r.stdout


def resolved_config(args, sets):
    """`llmtrain config show` of args.config with `sets` ("key=value"): (text, {key: value})."""
    cmd = [args.llmtrain, "config", "show", "--config", args.config]
    for s in sets:
        cmd += ["--set", s]
    shown = run(cmd)
    return shown, dict(re.findall(r"^(\w+) = (\S+)$", shown, re.M))
