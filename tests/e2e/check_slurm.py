#!/usr/bin/python3
"""A real one-node Slurm (Debian's slurm-wlm and munge, started here as root, stopped by PID at
the end), running scripts/slurm/train.sbatch: a 2-task job is preempted mid-run with
`scancel --signal=USR1`; llmtrain saves and exits 75, the script requeues the job, the requeued job
resumes from `latest` and finishes; the losses and grad norms of its metrics equal, bitwise, those
of an uninterrupted `srun -n 2 --mpi=pmix` run. Exits 77 (skipped) when not root or Slurm is not
installed."""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from harness import metrics  # noqa: E402 - the mpi tests' reader of metrics.jsonl

CONF = """ClusterName=llmt
SlurmctldHost={host}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmdSpoolDir={dir}/spool
StateSaveLocation={dir}/state
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmUser=root
SlurmdUser=root
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldPort={port}
SlurmdPort={port1}
NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def sh(cmd, env, check=True, **kw):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       **kw)
    if check and r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}: exit {r.returncode}\n{r.stdout}")
    return r.stdout


def wait(cond, timeout, what):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            sys.exit(f"FAIL: timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--sbatch-script", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    args.llmtrain, args.config = os.path.abspath(args.llmtrain), os.path.abspath(args.config)
    args.sbatch_script = os.path.abspath(args.sbatch_script)
    if os.geteuid() != 0 or not shutil.which("slurmctld") or not shutil.which("munged"):
        print("SKIP: needs root and slurm-wlm + munge (scripts/test.sh installs them)")
        sys.exit(77)
    w = os.path.abspath(args.workdir)
    shutil.rmtree(w, ignore_errors=True)
    d = os.path.join(w, "slurm")
    for sub in ["spool", "state"]:
        os.makedirs(os.path.join(d, sub))
    port = 20000 + os.getpid() % 20000
    host = socket.gethostname().split(".")[0]
    with open(os.path.join(d, "slurm.conf"), "w") as f:
        f.write(CONF.format(host=host, dir=d, port=port, port1=port + 1, cpus=os.cpu_count()))
    env = {**os.environ, "SLURM_CONF": os.path.join(d, "slurm.conf"), "OMP_NUM_THREADS": "1"}
    pids = []
    try:
        # A cluster that does not come up is this machine's problem, not llmtrain's: skip.
        for cmd, pid in [(["munged", "--force", f"--socket={d}/munge.socket",
                           f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                           f"--seed-file={d}/munge.seed"], "munged"),
                         (["slurmctld"], "slurmctld"), (["slurmd"], "slurmd")]:
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
            if r.returncode != 0:
                print(f"SKIP: {cmd[0]} did not start: {r.stdout}")
                sys.exit(77)
            pids.append(f"{d}/{pid}.pid")
        t0 = time.time()
        while "idle" not in sh(["sinfo", "-h", "-o", "%t"], env, check=False):
            if time.time() - t0 > 60:
                print("SKIP: the Slurm node did not become idle in 60 s:\n" +
                      open(f"{d}/slurmd.log").read()[-2000:])
                sys.exit(77)
            time.sleep(0.2)
        # The signal lands mid-run however long Slurm takes to deliver it (a few hundred steps of
        # this model on a quiet machine, more than 3000 under load): the job's rank 0 waits in
        # step 60 until a stop signal arrives (LLMTRAIN_FAULT=forward:60:0:WAIT, train/fault.h),
        # and the test signals once it has logged 50 steps.
        steps = 200
        sets = ["--set", f"train.steps={steps}", "--set", "optimizer.warmup_steps=10", "-q"]
        ref = os.path.join(w, "ref")
        sh(["srun", "-n", "2", "--mpi=pmix", args.llmtrain, "--config", args.config,
            "--set", f"train.run_dir={ref}"] + sets, env, timeout=600)
        want = [(m["loss"], m["grad_norm"]) for m in metrics(ref)]
        run = os.path.join(w, "job")
        os.makedirs(run)
        job = sh(["sbatch", "--parsable", "--chdir", run, f"--output={run}/job.out",
                  args.sbatch_script, args.config, "--set", f"train.run_dir={run}",
                  "--set", f"checkpoint.dir={run}/ckpt"] + sets,
                 {**env, "LLMTRAIN": args.llmtrain,
                  "LLMTRAIN_FAULT": "forward:60:0:WAIT"}).strip().split(";")[0]
        def started():
            if len(metrics(run)) >= 50:
                return True
            if sh(["squeue", "-h", "-j", job], env, check=False).strip() == "":
                sys.exit(f"FAIL: job {job} ended early:\n" +
                         open(os.path.join(run, "job.out")).read())
            return False

        wait(started, 300, "the job's first 50 steps")
        sh(["scancel", "--signal=USR1", job], env)  # preemption: every task of the job step
        # Slurm holds a requeued job for a while (its BeginTime); the test does not wait for that.
        # It may also have restarted already, or the run may have ended first (checked below).
        def requeued_or_done():
            state = sh(["squeue", "-h", "-j", job, "-o", "%t"], env, check=False).strip()
            if state == "PD":
                sh(["scontrol", "update", f"JobId={job}", "StartTime=now"], env, check=False)
                return True
            return state == "" or "restart count 1" in open(os.path.join(run, "job.out")).read()

        wait(requeued_or_done, 300, "the job to be requeued")
        wait(lambda: sh(["squeue", "-h", "-j", job], env, check=False).strip() == "" and
             len(metrics(run)) >= steps, 600, "the requeued job to finish")
        log = open(os.path.join(run, "job.out")).read()
        got = [(m["loss"], m["grad_norm"]) for m in metrics(run)]
        failures = []
        if "requeueing job" not in log or "restart count 1" not in log:
            failures.append(f"the job was not requeued and restarted:\n{log}")
        stopped = [line for line in log.splitlines() if line.startswith("stopped: SIGUSR1")]
        if not stopped:
            failures.append(f"no 'stopped: SIGUSR1' line:\n{log}")
        if got != want:
            diff = [i + 1 for i, (a, b) in enumerate(zip(got, want)) if a != b]
            failures.append(f"{len(got)} steps; differs from the uninterrupted run at {diff[:5]}")
        if failures:
            sys.exit("FAIL:\n  " + "\n  ".join(failures))
        print(f"slurm: job {job} preempted ({stopped[0]}), requeued, resumed; {steps} steps bitwise "
              "equal to the uninterrupted srun")
        print("OK")
    finally:
        # The daemons, by PID, newest first: SIGTERM, then SIGKILL after 10 s.
        for pid_file in reversed(pids):
            try:
                pid = int(open(pid_file).read().strip())
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                continue
            t0 = time.time()
            while time.time() - t0 < 10 and alive(pid):
                time.sleep(0.1)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    main()
