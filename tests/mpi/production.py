#!/usr/bin/python3
"""Runs that end early or go wrong, as an operator meets them (docs/slurm.md), on gpt-tiny.

  nonfinite  lr=1e6 (fp32): exit 1 naming the step and the values, before the update; keep_last=1
             keeps the last good checkpoint, which verifies and holds only finite values;
             on_nonfinite="skip" skips instead, and max_skipped_steps stops a run that only
             skips (fp32 skips, and fp16 overflows at loss scale 1); init_std=1e30 is refused
             (exit 2)
  signals    np=2: SIGTERM to rank 0 and SIGUSR1 to rank 1 mid-run: exit 75 with a checkpoint of
             the step it stopped at and a metrics line per step; `load = "auto"` resumes, and the
             losses and grad norms of the two parts are bitwise those of an uninterrupted run
  midstep    SIGTERM inside a step of 16 micro-batches per rank (np=2; 32 at np=1): the ranks agree
             to stop within two micro-batches, the step is dropped (exit 75, checkpoint and metrics
             of the step before), and the resumed run is bitwise the uninterrupted one
  interrupt  one SIGINT stops as SIGTERM does; a second SIGINT ends the process at once
  timelimit  train.time_limit=3 stops (exit 75, checkpoint saved) before 3 s of run time
  kill       SIGKILL at random moments of a run saving every step: metrics.jsonl always reaches
             the step `latest` names (the line is written before the save commits)
  auto       load = "auto" with step_* directories but no `latest`: exit 2 naming them, nothing
             overwritten
  launch     threads = 0 under `mpirun --bind-to none` (np=2) takes half the node's CPUs per rank,
             and OMP_NUM_THREADS or SLURM_CPUS_PER_TASK when set; the start-up line names the
             launcher, ranks, threads and device; a config error is printed once, not per rank
  watchdog   np=2 with comm.timeout_s=3: SIGSTOP one rank; the other aborts the job naming itself,
             the stopped rank (which did not answer),
             the operation and the group, within the timeout plus a few seconds
  memory     the bytes estimated before allocation (params, grads, optimizer) equal what the
             allocator reports (4 significant digits), activations a lower bound; n_layers=1e9
             exits 2 at once naming the numbers, as a 64 x 8192 model at dp=2 does
  diskfull   a save that cannot write its rank file (RLIMIT_FSIZE, as a full disk): exit 1 with
             the cause ("File too large"), no crash at exit, the previous checkpoint still latest
             and intact
  truncate   a dataset's .bin truncated while training (np=2): exit 1 naming the file and both
             sizes, instead of "Bus error"
  faults     the fault matrix for one signal (argument --signal: TERM, USR1 or KILL): the signal at
             {forward, backward, optimizer, save, load} x {rank 0, rank 1} of a np=2 run (the
             LLMTRAIN_FAULT test aid raises it at that exact point); after each cell `latest`
             verifies, TERM/USR1 exit 75 having lost no step, and resuming with load = "auto"
             gives bitwise the losses and grad norms of the uninterrupted run
  lock       while a run (np=2) trains, a second one on its run_dir, and one on its
             checkpoint.dir only, exit 2 naming the holder's host and pid; the first goes on"""
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

import harness
from harness import metrics

FAILURES = []


def check(ok, msg):
    if not ok:
        FAILURES.append(msg)


def cmd_of(args, run_dir, sets, ranks=1):
    cmd = [args.llmtrain, "--config", args.config, "-q", "--set", f"train.run_dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [args.mpirun, "--oversubscribe", "-np", str(ranks)] + cmd
    return cmd


def start(args, run_dir, sets, ranks=1, fresh=True, env=None):
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    return subprocess.Popen(cmd_of(args, run_dir, sets, ranks), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def train(args, run_dir, sets, ranks=1, fresh=True):
    p = start(args, run_dir, sets, ranks, fresh)
    out, _ = p.communicate()
    return p.returncode, out


def latest_step(ck):
    try:
        with open(os.path.join(ck, "latest")) as f:
            return int(f.read().strip()[5:])
    except FileNotFoundError:
        return 0


def rank_pids(args, proc):
    """The llmtrain rank processes started by `proc` (mpirun), in rank order (pid order: mpirun
    starts them in rank order). Only its descendants: other tests run llmtrain at the same time."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        for c in children.get(pid, []):
            todo.append(c)
            try:
                with open(f"/proc/{c}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[0].decode() == args.llmtrain:
                        out.append(c)
            except OSError:
                pass
    return sorted(out)


def wait_for_steps(run_dir, n, proc, timeout=120):
    t0 = time.time()
    while len(metrics(run_dir)) < n:
        if proc.poll() is not None or time.time() - t0 > timeout:
            sys.exit(f"FAIL: the run ended or stalled before step {n}:\n{proc.communicate()[0]}")
        time.sleep(0.02)


def all_finite(ck_step):
    with h5py.File(os.path.join(ck_step, "index.h5"), "r") as f:
        bad = []
        f.visititems(lambda n, o: bad.append(n) if isinstance(o, h5py.Dataset) and
                     not np.all(np.isfinite(o[()])) else None)
    return bad


def test_nonfinite(args, w):
    run_dir, ck = os.path.join(w, "lr"), os.path.join(w, "lr", "ck")
    rc, out = train(args, run_dir, ["optimizer.lr=1e6", "optimizer.warmup_steps=0",
                                    "optimizer.grad_clip=0", "train.steps=30",
                                    f"checkpoint.dir={ck}", "checkpoint.interval=1",
                                    "checkpoint.keep_last=1"])
    m = re.search(r"error: step (\d+): loss = \S+, grad_norm = \S+: not finite; stopped before "
                  r"the update, so the parameters \(and the last checkpoint\) are those of step "
                  r"(\d+)", out)
    check(rc == 1 and m is not None, f"lr=1e6: exit {rc}:\n{out}")
    if m:
        bad_step, good = int(m.group(1)), int(m.group(2))
        check(good == bad_step - 1, f"lr=1e6: steps {bad_step} / {good}")
        steps = sorted(d for d in os.listdir(ck) if d.startswith("step_"))
        check(latest_step(ck) <= good and len(steps) == 1,
              f"lr=1e6: latest {latest_step(ck)}, kept {steps}")
        ckstep = os.path.join(ck, steps[0]) if steps else ck
        v = subprocess.run([args.llmtrain, "checkpoint", "verify", ckstep],
                           stdout=subprocess.PIPE, text=True)
        check(v.returncode == 0, f"verify of the kept checkpoint:\n{v.stdout}")
        bad = all_finite(ckstep)
        check(not bad, f"kept checkpoint {steps} holds inf/nan in {bad[:3]}")
        check(metrics(run_dir)[-1]["step"] == bad_step, "the failing step's metrics line")
        print(f"nonfinite: stopped at step {bad_step} (exit 1), kept {steps[0]} finite")
    rc, out = train(args, os.path.join(w, "skip"), [
        "optimizer.lr=1e6", "optimizer.warmup_steps=0", "optimizer.grad_clip=0",
        "train.steps=40", "train.on_nonfinite=skip", "train.max_skipped_steps=4"])
    check(rc == 1 and re.search(r"4 steps skipped in a row \(train.max_skipped_steps=4; "
                                r"non-finite loss or gradient norm\)", out),
          f"on_nonfinite=skip, max 4: exit {rc}:\n{out}")
    sk = [r["skipped"] for r in metrics(os.path.join(w, "skip"))]
    check(sk[-4:] == [True] * 4, f"skip: skipped flags {sk}")
    rc, out = train(args, os.path.join(w, "fp16"), [
        "optimizer.lr=1e6", "optimizer.warmup_steps=0", "train.steps=200",
        "train.precision=fp16", "optimizer.initial_loss_scale=1", "train.max_skipped_steps=5"])
    check(rc == 1 and "steps skipped in a row (train.max_skipped_steps=5; fp16 overflow at loss "
          "scale 1)" in out, f"fp16 skipping at scale 1: exit {rc}:\n{out}")
    rc, out = train(args, os.path.join(w, "std"), ["model.init_std=1e30"])
    check(rc == 2 and "model.init_std=1e+30 must be <= 1.0" in out, f"init_std: {rc}\n{out}")
    print("nonfinite: skip + max_skipped_steps, fp16 at scale 1, init_std checked")


def resume_matches(args, run_dir, sets, ranks, ref, steps, name):
    """Resumes the stopped run in run_dir to the end: every step's loss and grad norm must be
    bitwise those of the uninterrupted run's metrics `ref`."""
    rc, out = train(args, run_dir, sets, ranks=ranks, fresh=False)
    got = metrics(run_dir)
    check(rc == 0 and len(got) == steps, f"{name} resume: exit {rc}, {len(got)} lines\n{out}")
    diff = [r["step"] for r, g in zip(ref, got)
            if (r["loss"], r["grad_norm"]) != (g["loss"], g["grad_norm"])]
    check(not diff, f"{name}: steps {diff[:5]} differ from the uninterrupted run")


def test_signals(args, w):
    # The signalled rank waits in step 60 until the signal arrives (LLMTRAIN_FAULT ... WAIT,
    # train/fault.h), so it lands mid-run however loaded the machine is.
    steps = 200
    sets = [f"train.steps={steps}", "optimizer.warmup_steps=10"]
    ref_dir = os.path.join(w, "ref")
    rc, out = train(args, ref_dir, sets, ranks=2)
    check(rc == 0, f"reference run: exit {rc}\n{out}")
    ref = metrics(ref_dir)
    for sig, rank in [(signal.SIGTERM, 0), (signal.SIGUSR1, 1)]:
        name = signal.Signals(sig).name
        run_dir = os.path.join(w, name)
        ck = os.path.join(run_dir, "ck")
        run_sets = sets + [f"checkpoint.dir={ck}", "checkpoint.load=auto"]
        p = start(args, run_dir, run_sets, ranks=2,
                  env={**os.environ, "LLMTRAIN_FAULT": f"forward:60:{rank}:WAIT"})
        wait_for_steps(run_dir, 50, p)
        pids = rank_pids(args, p)
        check(len(pids) == 2, f"{name}: rank pids {pids}")
        os.kill(pids[rank], sig)
        out = p.communicate()[0]
        stopped = latest_step(ck)
        n = len(metrics(run_dir))
        check(p.returncode == 75 and f"stopped: {name} after step {stopped}" in out,
              f"{name}: exit {p.returncode}:\n{out}")
        check(0 < stopped < steps and n == stopped,
              f"{name}: latest step {stopped}, {n} metrics lines")
        resume_matches(args, run_dir, run_sets, 2, ref, steps, name)
        print(f"signals: {name} to rank {rank} stopped at step {stopped} (exit 75); resumed run "
              f"bitwise equal to the uninterrupted one over {steps} steps")


def test_midstep(args, w):
    # Steps of 16 micro-batches per rank (global batch 64, micro-batches of 2, dp 2; 32 on one): the
    # signalled rank waits before step 4's second micro-batch until the signal arrives, and the
    # ranks agree to stop one to two micro-batches later, inside the step. Then on one rank.
    steps = 6
    sets = [f"train.steps={steps}", "train.global_batch_size=64", "optimizer.warmup_steps=2"]
    for ranks, rank in [(2, 1), (1, 0)]:
        ref_dir = os.path.join(w, f"ref{ranks}")
        rc, out = train(args, ref_dir, sets, ranks=ranks)
        check(rc == 0, f"reference run: exit {rc}\n{out}")
        ref = metrics(ref_dir)
        run_dir = os.path.join(w, f"mid{ranks}")
        ck = os.path.join(run_dir, "ck")
        run_sets = sets + [f"checkpoint.dir={ck}", "checkpoint.load=auto"]
        p = start(args, run_dir, run_sets, ranks=ranks,
                  env={**os.environ, "LLMTRAIN_FAULT": f"micro:4:{rank}:WAIT"})
        wait_for_steps(run_dir, 3, p)
        time.sleep(0.5)  # the rank is inside step 4 now (or about to be: it waits there)
        pids = rank_pids(args, p) if ranks > 1 else [p.pid]
        os.kill(pids[rank], signal.SIGTERM)
        out = p.communicate()[0]
        n = len(metrics(run_dir))
        want = ("stopped: SIGTERM after step 3 (inside step 4, after ")
        check(p.returncode == 75 and want in out and latest_step(ck) == 3 and n == 3,
              f"midstep np={ranks}: exit {p.returncode}, latest {latest_step(ck)}, {n} metrics "
              f"lines:\n{out}")
        # One rank stops at the boundary where it sees the signal; several agree a boundary or
        # two later (the all-reduce started at one boundary is read at the next).
        per_rank = 32 // ranks
        done = re.search(rf"after (\d+) of its {per_rank} micro-batches", out)
        check(done and (1 if ranks == 1 else 2) <= int(done.group(1)) <= (1 if ranks == 1 else 3),
              f"midstep np={ranks}: not stopped within two micro-batches:\n{out}")
        resume_matches(args, run_dir, run_sets, ranks, ref, steps, f"midstep np={ranks}")
        print(f"midstep: np={ranks}: SIGTERM inside step 4 stopped after "
              f"{done.group(1) if done else '?'} of {per_rank} micro-batches (exit 75, latest step 3); "
              f"the resumed run is bitwise equal to the uninterrupted one over {steps} steps")


def test_interrupt(args, w):
    run_dir, ck = os.path.join(w, "int"), os.path.join(w, "int", "ck")
    sets = ["train.steps=100000", f"checkpoint.dir={ck}"]
    p = start(args, run_dir, sets)
    wait_for_steps(run_dir, 50, p)
    p.send_signal(signal.SIGINT)
    out = p.communicate()[0]
    check(p.returncode == 75 and latest_step(ck) == len(metrics(run_dir)),
          f"one SIGINT: exit {p.returncode}, latest {latest_step(ck)}:\n{out}")
    # Steps of about a second, so that the second SIGINT comes before the first one's step ends.
    p = start(args, run_dir + "2", ["train.steps=100000", "model.n_layers=8", "model.d_model=256",
                                    "model.seq_len=256", f"checkpoint.dir={ck}2"])
    wait_for_steps(run_dir + "2", 1, p)
    p.send_signal(signal.SIGINT)
    time.sleep(0.1)  # two signals sent at once may arrive as one
    p.send_signal(signal.SIGINT)
    p.communicate()
    check(p.returncode == -signal.SIGINT and latest_step(ck + "2") == 0,
          f"two SIGINTs: exit {p.returncode}, latest {latest_step(ck + '2')}")
    print("interrupt: one SIGINT saves and exits 75, a second ends the process")


def test_timelimit(args, w):
    run_dir, ck = os.path.join(w, "time"), os.path.join(w, "time", "ck")
    t0 = time.time()
    rc, out = train(args, run_dir, ["train.steps=1000000", "train.time_limit=3",
                                    f"checkpoint.dir={ck}"])
    took = time.time() - t0
    check(rc == 75 and "stopped: train.time_limit after step" in out and latest_step(ck) > 0,
          f"time_limit: exit {rc}:\n{out}")
    # The limit counts from the trainer's start; MPI-free start-up adds a little, a loaded CI
    # machine more.
    check(took < 3 + 6, f"time_limit=3: the process took {took:.1f} s")
    print(f"timelimit: stopped after step {latest_step(ck)}, process {took:.1f} s for a 3 s limit")


def test_kill(args, w):
    run_dir, ck = os.path.join(w, "kill"), os.path.join(w, "kill", "ck")
    sets = ["train.steps=400", f"checkpoint.dir={ck}", "checkpoint.interval=1",
            "checkpoint.keep_last=2", "checkpoint.load=auto"]
    shutil.rmtree(run_dir, ignore_errors=True)
    rng = random.Random(7)
    kills = 0
    while kills < 12:
        p = start(args, run_dir, sets, fresh=False)
        time.sleep(rng.uniform(0.3, 1.2))
        if p.poll() is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
            continue
        p.kill()
        p.wait()
        kills += 1
        lines, latest = metrics(run_dir), latest_step(ck)
        check(latest == 0 or (lines and lines[-1]["step"] >= latest),
              f"kill {kills}: latest step {latest}, metrics end at "
              f"{lines[-1]['step'] if lines else None}")
    print(f"kill: {kills} SIGKILLs, metrics.jsonl always reached the step `latest` named")


def test_auto(args, w):
    run_dir, ck = os.path.join(w, "auto"), os.path.join(w, "auto", "ck")
    rc, out = train(args, run_dir, ["train.steps=4", f"checkpoint.dir={ck}",
                                    "checkpoint.interval=2"])
    check(rc == 0, f"auto setup: {rc}\n{out}")
    os.remove(os.path.join(ck, "latest"))
    before = {d: os.path.getmtime(os.path.join(ck, d)) for d in os.listdir(ck) if d[:5] == "step_"}
    rc, out = train(args, run_dir, ["train.steps=4", f"checkpoint.dir={ck}",
                                    "checkpoint.load=auto"], fresh=False)
    check(rc == 2 and "has 2 checkpoint directories (step_00000002 ... step_00000004) but no "
          "latest file" in out, f"load=auto without latest: exit {rc}:\n{out}")
    after = {d: os.path.getmtime(os.path.join(ck, d)) for d in os.listdir(ck) if d[:5] == "step_"}
    check(before == after, f"checkpoints touched: {before} -> {after}")
    print("auto: refused (exit 2) with checkpoints but no latest")


def test_lock(args, w):
    run_dir, ck = os.path.join(w, "first"), os.path.join(w, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    p = start(args, run_dir, ["train.steps=100000", f"checkpoint.dir={ck}"], ranks=2)
    wait_for_steps(run_dir, 20, p)
    holder = rank_pids(args, p)[0]
    for other, sets in [(run_dir, []), (os.path.join(w, "second"), [f"checkpoint.dir={ck}"])]:
        rc, out = train(args, other, ["train.steps=5"] + sets, fresh=False)
        key = "train.run_dir" if other == run_dir else "checkpoint.dir"
        check(rc == 2 and re.search(key + r'="[^"]+" is in use by another llmtrain run \(host '
                                    r'\S+, pid ' + str(holder) + r"\)", out),
              f"second run on the {key}: exit {rc}:\n{out}")
    n = len(metrics(run_dir))
    wait_for_steps(run_dir, n + 20, p)  # the first run goes on
    os.kill(rank_pids(args, p)[0], signal.SIGTERM)
    out = p.communicate()[0]
    check(p.returncode == 75, f"first run: exit {p.returncode}\n{out}")
    print(f"lock: second runs on run_dir and checkpoint.dir refused naming pid {holder}")


def test_launch(args, w):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    # What threads = 0 gives a rank here (kernels/threads.h): its affinity mask, or the node's
    # CPUs over the 2 ranks when the mask is the whole node.
    mask, node = len(os.sched_getaffinity(0)), os.cpu_count()
    per_rank = max(1, mask // 2) if mask >= node else mask
    why = (f"{mask} CPUs of the node / 2 unbound ranks" if mask >= node else
           f"affinity mask: {mask} CPU{'s' if mask > 1 else ''}")

    def launch_line(extra_env, bind="none"):
        cmd = cmd_of(args, os.path.join(w, "t"), ["train.steps=2", "train.threads=0"], 2)
        cmd = [c for c in cmd if c != "-q"]  # the start-up line is not quiet
        cmd[1:1] = ["--bind-to", bind]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**env, **extra_env})
        m = re.search(r"^launch: .*$", r.stdout, re.M)
        return m.group(0) if m else r.stdout

    got = launch_line({})
    want = (f"launch: mpirun, 2 ranks (2 per node), {per_rank} thread"
            f"{'s' if per_rank > 1 else ''} per rank ({why}), device cpu")
    check(got == want, f"unbound: {got!r}, expected {want!r}")
    got = launch_line({"OMP_NUM_THREADS": "1"})
    check("1 thread per rank (OMP_NUM_THREADS)" in got, f"OMP_NUM_THREADS=1: {got!r}")
    got = launch_line({"SLURM_CPUS_PER_TASK": "1"})
    check("1 thread per rank (SLURM_CPUS_PER_TASK)" in got, f"SLURM_CPUS_PER_TASK=1: {got!r}")
    r = subprocess.run(cmd_of(args, os.path.join(w, "bad"), ["train.steps=x"], 2),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    n = r.stdout.count("train.steps at --set: expected an integer")
    check(n == 1, f"a config error at np=2 printed {n} times:\n{r.stdout}")
    print(f"launch: threads = 0 gives {per_rank} per unbound rank; env settings honoured; one "
          "config error line at np=2")


def test_watchdog(args, w):
    run_dir = os.path.join(w, "wd")
    p = start(args, run_dir, ["train.steps=1000000", "comm.timeout_s=3"], ranks=2)
    wait_for_steps(run_dir, 50, p)
    stopped = rank_pids(args, p)[1]
    os.kill(stopped, signal.SIGSTOP)
    t0 = time.time()
    try:
        out = p.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        out = p.communicate()[0]
    took = time.time() - t0
    try:
        os.kill(stopped, signal.SIGKILL)
    except ProcessLookupError:
        pass
    check(p.returncode not in (0, None) and re.search(
        r"error: rank 0: \w+( #\d+)? on \S+ \(\d+ ranks\)( with rank 1)? did not complete "
        r"within 3 s \(comm.timeout_s", out), f"watchdog: exit {p.returncode}:\n{out}")
    check("  rank 1: did not answer: it is outside every collective" in out,
          f"watchdog: the verdict does not name the stopped rank 1:\n{out}")
    check(took < 3 + 10, f"watchdog: the job ended {took:.1f} s after the rank stopped")
    print(f"watchdog: job aborted {took:.1f} s after SIGSTOP of rank 1 (timeout 3 s)")


def test_memory(args, w):
    unit = {"MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    run_dir = os.path.join(w, "tiny")
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier test run's would be refused
    r = subprocess.run([c for c in cmd_of(args, run_dir, ["train.steps=2"]) if c != "-q"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.search(r"params ([\d.e+]+) (\wiB), grads ([\d.e+]+) (\wiB), optimizer ([\d.e+]+) "
                  r"(\wiB), activations >= ([\d.e+]+) (\wiB)", r.stdout)
    check(r.returncode == 0 and m, f"memory line:\n{r.stdout}")
    if m:
        est = [float(m.group(i)) * unit[m.group(i + 1)] for i in (1, 3, 5, 7)]
        peak = metrics(run_dir)[-1]["peak_bytes"]
        for name, e in zip(["params", "grads", "optimizer"], est):
            check(abs(e - peak[name]) <= 5e-4 * peak[name],
                  f"{name}: estimated {e:.0f} B, allocated {peak[name]} B")
        check(est[3] <= peak["activations"],
              f"activations: estimated >= {est[3]:.0f} B, allocated {peak['activations']} B")
    # The second line: plan's figures, activations included (within 2% of the allocator).
    m = re.search(r"memory: [\d.]+ \wiB per rank \(params ([\d.e+]+) (\wiB), grads ([\d.e+]+) "
                  r"(\wiB), optimizer ([\d.e+]+) (\wiB), activations ([\d.e+]+) (\wiB); comm "
                  r"buffers about", r.stdout)
    check(m is not None, f"plan's memory line:\n{r.stdout}")
    if m:
        est = [float(m.group(i)) * unit[m.group(i + 1)] for i in (1, 3, 5, 7)]
        peak = metrics(run_dir)[-1]["peak_bytes"]
        for name, e in zip(["params", "grads", "optimizer", "activations"], est):
            check(abs(e - peak[name]) <= 0.02 * peak[name],
                  f"{name}: plan's {e:.0f} B, allocated {peak[name]} B")
    t0 = time.time()
    rc, out = train(args, os.path.join(w, "huge"), ["model.n_layers=1000000000"])
    check(rc == 2 and time.time() - t0 < 10 and re.search(
        r"error: this run needs at least [\d.]+ TiB on the node of rank 0 \(1 rank x ", out),
        f"n_layers=1e9: exit {rc}:\n{out}")
    rc, out = train(args, os.path.join(w, "big"), ["model.n_layers=64", "model.d_model=8192",
                                                   "model.n_heads=64"], ranks=2)
    check(rc == 2 and out.count("error: this run needs at least") == 1,
          f"64 x 8192 at dp=2: exit {rc}:\n{out}")
    # Past the bound but not past plan's figures: a model whose activations are what does not
    # fit (a long sequence, a large micro-batch) is refused by the second check.
    avail = re.search(r"on this node; ([\d.]+) (\wiB) available", r.stdout)
    if avail:
        have = float(avail.group(1)) * unit[avail.group(2)]
        # A micro-batch whose activations (plan --json) need twice what is available, with the
        # state and the bound far below it.
        seqs = 1
        while True:
            sets = [f"train.global_batch_size={seqs}", f"train.micro_batch_size={seqs}"]
            plan = subprocess.run([args.llmtrain, "plan", "--config", args.config, "--json",
                                   "--hardware", "h100-80gb-sxm"] +
                                  [x for v in sets for x in ("--set", v)],
                                  capture_output=True, text=True, check=True)
            if json.loads(plan.stdout)["stages"][0]["memory"]["activations"] > 2 * have:
                break
            seqs *= 2
        rc, out = train(args, os.path.join(w, "acts"), sets)
        check(rc == 2 and "error: this run needs " in out and "activations" in out and
              "at least" not in out, f"activations past the memory: exit {rc}:\n{out[-2000:]}")
    print("memory: the bound and plan's figures equal the allocator's; oversized runs exit 2")


def test_diskfull(args, w):
    import resource
    run_dir, ck = os.path.join(w, "df"), os.path.join(w, "df", "ck")
    sets = ["train.steps=4", f"checkpoint.dir={ck}", "checkpoint.interval=2",
            "checkpoint.load=auto"]
    rc, out = train(args, run_dir, ["train.steps=2", f"checkpoint.dir={ck}"])
    check(rc == 0 and latest_step(ck) == 2, f"the first run: exit {rc}\n{out}")

    def limited():  # SIGXFSZ keeps its default action (subprocess restores it): llmtrain ignores it
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    r = subprocess.run(cmd_of(args, run_dir, sets), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, preexec_fn=limited)
    check(r.returncode == 1 and "failed: File too large" in r.stdout,
          f"save on a full disk: exit {r.returncode}:\n{r.stdout}")
    check(latest_step(ck) == 2, f"latest after the failed save: {latest_step(ck)}")
    v = subprocess.run([args.llmtrain, "checkpoint", "verify", ck], stdout=subprocess.PIPE,
                       text=True)
    check(v.returncode == 0, f"verify of the previous checkpoint:\n{v.stdout}")
    print("diskfull: exit 1 naming the cause, step 2 still latest and verified")


def test_truncate(args, w):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
    from check_megatron_format import write_dataset  # noqa: E402 - the e2e tests' writer
    rng = np.random.default_rng(3)
    prefix = os.path.join(w, "corpus")
    write_dataset(prefix, np.uint16, [[rng.integers(0, 256, 120).tolist()] for _ in range(3000)])
    run_dir = os.path.join(w, "tr")
    p = start(args, run_dir, ["train.steps=100000", "data.source=indexed", f"data.path={prefix}",
                              "data.split=100,0,0"], ranks=2)
    wait_for_steps(run_dir, 20, p)
    size = os.path.getsize(prefix + ".bin")
    os.truncate(prefix + ".bin", size // 10)
    try:
        out = p.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        out = p.communicate()[0]
    check(p.returncode == 1 and f"corpus.bin: the file shrank from {size} to {size // 10} bytes "
          "while training" in out and "Bus error" not in out,
          f"truncated .bin: exit {p.returncode}:\n{out}")
    print(f"truncate: exit 1 naming the file ({size} -> {size // 10} bytes)")


def test_faults(args, w):
    sig = args.signal
    base = ["train.steps=12", "checkpoint.interval=4", "checkpoint.load=auto"]
    ref_dir = os.path.join(w, "ref")
    rc, out = train(args, ref_dir, base + [f"checkpoint.dir={os.path.join(ref_dir, 'ck')}"],
                    ranks=2)
    check(rc == 0, f"reference: exit {rc}\n{out}")
    ref = [(m["loss"], m["grad_norm"]) for m in metrics(ref_dir)]
    cells = 0
    for phase in ["forward", "backward", "optimizer", "save", "load"]:
        for rank in [0, 1]:
            cell = f"{phase}-rank{rank}"
            run_dir = os.path.join(w, cell)
            ck = os.path.join(run_dir, "ck")
            sets = base + [f"checkpoint.dir={ck}"]
            shutil.rmtree(run_dir, ignore_errors=True)
            step = 8 if phase == "save" else 6  # saves happen at 4, 8, 12
            if phase == "load":  # a checkpoint to load first
                rc, out = train(args, run_dir, sets + ["train.steps=12"], ranks=2)
                shutil.rmtree(os.path.join(ck, "step_00000008"))
                shutil.rmtree(os.path.join(ck, "step_00000012"))
                with open(os.path.join(ck, "latest"), "w") as f:
                    f.write("step_00000004\n")
            env = {**os.environ, "LLMTRAIN_FAULT": f"{phase}:{step}:{rank}:{sig}"}
            r = subprocess.run(cmd_of(args, run_dir, sets, 2), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
            latest = latest_step(ck)
            v = subprocess.run([args.llmtrain, "checkpoint", "verify", ck],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            check(v.returncode == 0, f"{sig} {cell}: latest (step {latest}) does not verify:\n"
                  f"{v.stdout}")
            if sig == "KILL":
                check(r.returncode != 0, f"{sig} {cell}: exit {r.returncode}")
            else:
                # The stop is agreed at a step's end before its save: a signal during the save
                # of step 8 stops the run after step 9 (with a checkpoint of 9); one during load,
                # after the first step.
                stopped = {"load": 5, "save": step + 1}.get(phase, step)
                check(r.returncode == 75 and latest == stopped,
                      f"{sig} {cell}: exit {r.returncode}, latest {latest} (want 75 and step "
                      f"{stopped}):\n{r.stdout}")
            rc, out = train(args, run_dir, sets, ranks=2, fresh=False)
            got = [(m["loss"], m["grad_norm"]) for m in metrics(run_dir)]
            check(rc == 0 and got == ref, f"{sig} {cell}: resumed run exit {rc}, "
                  f"{len(got)} lines; differs from the reference at "
                  f"{[i + 1 for i, (a, b) in enumerate(zip(got, ref)) if a != b][:5]}")
            cells += 1
    print(f"faults: SIG{sig} in {cells} cells; every latest verified, every resume bitwise equal")


def main():
    def extra(ap):
        ap.add_argument("check", choices=[
            "nonfinite", "signals", "midstep", "interrupt", "timelimit", "kill", "auto", "lock", "launch",
            "watchdog", "memory", "diskfull", "truncate", "faults"])
        ap.add_argument("--signal", choices=["TERM", "USR1", "KILL"], default="TERM")

    args = harness.parse_args(extra)
    os.makedirs(args.workdir, exist_ok=True)
    globals()["test_" + args.check](args, args.workdir)
    harness.finish(FAILURES)


if __name__ == "__main__":
    main()
