"""Every command block of README.md and docs/*.md runs as written, in order, file by file
(ctest e2e_docs_commands).

Blocks: fenced ```bash, ```sh, ```shell and ```console blocks (console: the `$ ` lines), also
indented ones inside list items. A block that cannot run on a CPU-only machine says so in the
markdown, on the line right before its fence, with its reason:

    <!-- docs-test: skip (needs a GPU) -->

and the test prints each skipped block with that reason. A block the commands read as a file
(the tutorial's run.toml) is marked `<!-- docs-test: file NAME -->` and written to NAME before
the file's commands run; `<!-- docs-test: file NAME (trained with --set K=V ...: REASON) -->`
also adds those --set values to every `train` of that config (the wrapper below), and only to
those. Any other docs-test comment, or one not right before a fence, fails the test.

Where the commands run: a scratch folder (--workdir, made afresh) holding copies of configs/
and scripts/, the quickstart corpus built there by scripts/corpus.sh (.cache/corpus, as
configs/quickstart.toml expects), corpus.txt (the tutorial's "any UTF-8 text": the first
CORPUS_BYTES of that corpus's text) and the quickstart's state, runs/quickstart (what README.md
says scripts/quickstart.sh leaves: its mpirun training command, shortened as below). `llmtrain`
on PATH and build/app/llmtrain are both the wrapper below; build/scripts/bench/ links to the
build's benchmark programs. The scratch folder is removed when every command passed.

Each markdown file's commands run in one bash process under `set -e` (a failing command ends
the file), stdin from /dev/null. The environment: as root, exactly the `export ...` README.md
says a root user needs for mpirun (read from README.md, so a wrong sentence there fails here);
Open MPI variables inherited from the caller are removed (OMPI_ALLOW_RUN_AS_ROOT*,
OMPI_MCA_rmaps_base_oversubscribe: the docs must say --oversubscribe where they need it), except
for this test's own OMPI_MCA_orte_tmpdir_base, a private session folder (ctest runs other mpirun
tests beside this one; tests/mpi/CMakeLists.txt).

Shortened trainings (with the file markers' --set values, the only change to the commands;
made by the wrapper, which prints it on each run): a `train` of SCALE_MIN_STEPS steps or more
runs 1/SCALE of them. Each of its step counts (STEP_KEYS as `llmtrain config show` resolves
them from the config and the command's own --set values, and --stop-after-steps) is divided by
SCALE, rounded up; a command's own --set of one of those keys is replaced by the divided value,
the others are added, and everything else is passed on unchanged. So runs that build on each
other keep their relations: a run of 200 steps with checkpoints every 50 becomes 10 steps with
checkpoints every 3 (and after the last), and the run that resumes it with --set
train.steps=300 trains steps 11..15. Shorter runs (the benchmarks' and --shrink's few steps)
run as written.

A failure names the file, the block's line, the command, and prints the tail of its output.

  check_docs.py --llmtrain BUILD/app/llmtrain --source REPO --workdir DIR
"""
import argparse
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

SCALE = 20
SCALE_MIN_STEPS = 50
STEP_KEYS = ("train.steps", "train.eval_interval", "checkpoint.interval", "optimizer.warmup_steps",
             "optimizer.decay_steps")
CORPUS_BYTES = 600_000
FENCE = re.compile(r"^(\s*)(`{3,})(\w*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:(.*?)-->\s*$")
SHELLS = ("bash", "sh", "shell", "console")


# --- the wrapper: `llmtrain` inside the scratch folder ---------------------------------------

def set_key(arg):
    return arg.split("=", 1)[0].strip()


def wrap(real, args):
    """Runs `real args`, a `train` shortened as the module docstring says."""
    commands = {"train", "config", "data", "checkpoint", "plan", "eval", "generate"}
    if args and (args[0] in commands or not args[0].startswith("-")) and args[0] != "train":
        os.execv(real, [real] + args)
    # `train` (also the default subcommand): find --config, the --set values and --shrink.
    config, sets, shrink, stop = None, [], False, None
    i = 1 if args and args[0] == "train" else 0
    while i < len(args):
        a = args[i]
        if a in ("-c", "--config") and i + 1 < len(args):
            config = args[i + 1]
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
        elif a == "--stop-after-steps" and i + 1 < len(args):
            stop = i + 1
        elif a == "--set" and i + 1 < len(args):
            sets.append((i + 1, args[i + 1]))
        elif a.startswith("--set="):
            sets.append((i, a))
        elif a == "--shrink":
            shrink = True
        i += 1
    if config is None:
        os.execv(real, [real] + args)
    extra = json.loads(os.environ.get("LLMT_DOCS_TRAIN_SETS", "{}"))
    added = extra.get(os.path.realpath(config), [])
    args = list(args)
    for s in added:
        args += ["--set", s]
        sets.append((len(args) - 1, s))
    own = [v.removeprefix("--set=") for _, v in sets]
    show = [real, "config", "show", "--config", config] + (["--shrink"] if shrink else [])
    for s in own:
        show += ["--set", s]
    proc = subprocess.run(show, capture_output=True, text=True)
    note = []
    if proc.returncode == 0:  # else train reports the config's problem itself
        # The resolved TOML; the mesh table that follows "# parameters: ..." is not TOML.
        resolved = tomllib.loads(proc.stdout.split("\n# parameters:")[0])
        value = {k: resolved.get(k.split(".")[0], {}).get(k.split(".")[1], 0) for k in STEP_KEYS}
        if value["train.steps"] >= SCALE_MIN_STEPS:
            for k in STEP_KEYS:
                if value[k] <= 0:
                    continue
                new = math.ceil(value[k] / SCALE)
                note.append(f"{k} {value[k]} -> {new}")
                where = [j for j, v in sets if set_key(v.removeprefix("--set=")) == k]
                for j in where:
                    args[j] = (f"--set={k}={new}" if args[j].startswith("--set=") else f"{k}={new}")
                if not where:
                    args += ["--set", f"{k}={new}"]
            if stop is not None:
                new = math.ceil(int(args[stop]) / SCALE)
                note.append(f"--stop-after-steps {args[stop]} -> {new}")
                args[stop] = str(new)
    if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0" and (note or added):
        print("docs-test wrapper: " + ", ".join(note + [f"+ --set {s}" for s in added]),
              file=sys.stderr, flush=True)
    os.execv(real, [real] + args)


# --- reading the markdown ---------------------------------------------------------------------

class Block:
    def __init__(self, path, line, lang, body, marker):
        self.path, self.line, self.lang, self.body, self.marker = path, line, lang, body, marker

    def where(self):
        return f"{self.path}:{self.line}"

    def commands(self):
        """(first line, text) of each command: continuation lines joined, comment and blank lines
        dropped, `$ ` prompts of console blocks removed. The text is passed to bash as written."""
        out, cur, start = [], [], 0
        for n, line in enumerate(self.body):
            if self.lang == "console" and not cur:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not cur and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if not cur:
                start = self.line + 1 + n
            cur.append(line)
            if not line.rstrip().endswith("\\"):
                out.append((start, "\n".join(cur)))
                cur = []
        if cur:
            sys.exit(f"FAIL: {self.where()}: the block ends in a line continuation")
        return out


def read_blocks(path, rel):
    """Every fenced block of a markdown file (shell ones and those with a marker), in order."""
    lines = path.read_text().split("\n")
    blocks, i, mark = [], 0, None
    while i < len(lines):
        marker = MARKER.match(lines[i])
        if marker:
            if i + 1 == len(lines) or not FENCE.match(lines[i + 1]):
                sys.exit(f"FAIL: {rel}:{i + 1}: a docs-test comment not right before a fence")
            mark = marker.group(1).strip()
            i += 1
            continue
        if re.match(r"^\s*<!--\s*docs-test", lines[i]):
            sys.exit(f"FAIL: {rel}:{i + 1}: a docs-test comment this test cannot read: {lines[i]}")
        m = FENCE.match(lines[i])
        if m:
            indent, ticks, lang = m.groups()
            j = i + 1
            while j < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[j]):
                j += 1
            if j == len(lines):
                sys.exit(f"FAIL: {rel}:{i + 1}: unclosed code fence")
            body = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]]
            if lang in SHELLS or mark is not None:
                blocks.append(Block(rel, i + 1, lang, body, mark))
            mark, i = None, j
        i += 1
    return blocks


def parse_marker(block):
    """('run', None) | ('skip', reason) | ('file', (name, sets, reason))."""
    if block.marker is None:
        return "run", None
    m = re.fullmatch(r"skip \((.+)\)", block.marker, re.S)
    if m and block.lang in SHELLS:
        return "skip", " ".join(m.group(1).split())
    m = re.fullmatch(r"file (\S+)(?: \(trained with (.+): (.+)\))?", block.marker, re.S)
    if m and block.lang not in SHELLS:
        words = shlex.split(m.group(2) or "")
        if len(words) % 2 or any(w != "--set" for w in words[::2]):
            sys.exit(f"FAIL: {block.where()}: expected --set K=V ... in the marker: {block.marker}")
        return "file", (m.group(1), words[1::2], m.group(3))
    sys.exit(f"FAIL: {block.where()}: a docs-test comment this test cannot read: {block.marker}"
             " (expected `skip (REASON)` before a shell block, `file NAME` before another)")


# --- running -----------------------------------------------------------------------------------

def root_exports(readme):
    """The `export ...` that README.md says a root user needs before mpirun."""
    text = " ".join(readme.read_text().split())
    m = re.search(r"as root [^`]*Open MPI also wants `(export OMPI_[^`]*)`", text)
    if not m:
        sys.exit("FAIL: README.md no longer says what a root user must export for mpirun "
                 "(\"as root ... Open MPI also wants `export OMPI_...`\"): update this test")
    return m.group(1)


def run_file(rel, steps, scratch, env, preamble):
    """Runs one markdown file's commands in one bash; returns the failures and how many passed."""
    log = scratch / ".docs-test" / (rel.replace("/", "_") + ".log")
    script = ["set -e", preamble,
              "__docs_mark() { printf '\\n\\036docs-test %s %s\\n' \"$1\" \"$EPOCHREALTIME\"; }"]
    for n, (block, line, text) in enumerate(steps):
        script += [f"__docs_mark {n}", text]
    script.append(f"__docs_mark {len(steps)}")
    with open(log, "w") as out:
        rc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env,
                            stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    parts = re.split(r"\n?\x1edocs-test (\d+) ([0-9.,]+)\n", log.read_text())
    marks = [(int(parts[k]), float(parts[k + 1].replace(",", ".")), parts[k + 2])
             for k in range(1, len(parts), 3)]
    for (n, t, output), nxt in zip(marks, marks[1:] + [None]):
        if n == len(steps):
            break
        block, line, text = steps[n]
        flat = " ".join(text.replace("\\\n", " ").split())
        if nxt is None:
            tail = "\n".join(output.rstrip().split("\n")[-40:])
            print(f"FAIL {rel}:{line} (block at line {block.line}), exit {rc}:\n  $ {flat}\n"
                  f"--- its output, last 40 lines:\n{tail}\n---", flush=True)
            return [f"{rel}:{line}: {flat}"], n
        print(f"  ok {nxt[1] - t:6.1f} s  {rel}:{line}  $ {flat}", flush=True)
    if rc != 0:
        print(f"FAIL {rel}: bash exited {rc} after the last command", flush=True)
        return [f"{rel}: exit {rc}"], len(steps)
    return [], len(steps)


def prepare(args, scratch, env, preamble):
    """The scratch folder: sources, corpus, the quickstart's state (module docstring)."""
    for d in ("configs", "scripts"):
        shutil.copytree(args.source / d, scratch / d, ignore=shutil.ignore_patterns("__pycache__"))
    build = args.llmtrain.resolve().parent.parent
    (scratch / "build" / "app").mkdir(parents=True)
    (scratch / "bin").mkdir()
    wrapper = (f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
               f"{shlex.quote(str(pathlib.Path(__file__).resolve()))} --wrap "
               f"{shlex.quote(str(args.llmtrain.resolve()))} -- \"$@\"\n")
    for w in (scratch / "build" / "app" / "llmtrain", scratch / "bin" / "llmtrain"):
        w.write_text(wrapper)
        w.chmod(0o755)
    (scratch / "build" / "scripts").mkdir()
    (scratch / "build" / "scripts" / "bench").symlink_to(build / "scripts" / "bench")
    (scratch / ".docs-test").mkdir()
    t = time.time()
    corpus = subprocess.run(["bash", "scripts/corpus.sh", str(args.llmtrain)], cwd=scratch, env=env,
                            capture_output=True, text=True)
    if corpus.returncode != 0:
        sys.exit(f"FAIL: scripts/corpus.sh exited {corpus.returncode}\n{corpus.stderr}")
    text = (scratch / ".cache" / "corpus" / "fortunes.txt").read_bytes()
    cut = text.find(b"\n\n", CORPUS_BYTES) + 2  # whole documents
    (scratch / "corpus.txt").write_bytes(text[:cut] if cut > 1 else text)
    print(f"setup: .cache/corpus by scripts/corpus.sh, corpus.txt its first {cut} bytes "
          f"({time.time() - t:.1f} s)", flush=True)
    # What scripts/quickstart.sh trains (its mpirun line, without the corpus --set values that
    # repeat configs/quickstart.toml's defaults), shortened by the wrapper.
    t = time.time()
    cmd = ("mpirun --oversubscribe -np 2 ./build/app/llmtrain train "
           "--config configs/quickstart.toml --overwrite -q")
    quick = subprocess.run(["bash", "-c", preamble + "\n" + cmd], cwd=scratch,
                           env=env, capture_output=True, text=True)
    if quick.returncode != 0:
        sys.exit(f"FAIL: the quickstart's state: {cmd} exited {quick.returncode}\n"
                 f"{quick.stdout[-3000:]}\n{quick.stderr[-3000:]}")
    note = [l for l in quick.stderr.splitlines() if l.startswith("docs-test wrapper:")]
    print(f"setup: runs/quickstart: $ {cmd} ({time.time() - t:.1f} s; {' '.join(note)})",
          flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--wrap":
        wrap(sys.argv[2], sys.argv[4:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--llmtrain", required=True, type=pathlib.Path)
    p.add_argument("--source", required=True, type=pathlib.Path)
    p.add_argument("--workdir", required=True, type=pathlib.Path)
    args = p.parse_args()
    start = time.time()
    scratch = args.workdir.resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    session = pathlib.Path(tempfile.mkdtemp(prefix="ompi-docs-"))  # short: Unix socket paths
    try:
        sys.exit(check(args, scratch, session, start))
    finally:
        shutil.rmtree(session, ignore_errors=True)


def check(args, scratch, session, start):
    files = [args.source / "README.md"] + sorted((args.source / "docs").glob("*.md"))
    plan = []  # (rel, blocks)
    for f in files:
        rel = str(f.relative_to(args.source))
        plan.append((rel, read_blocks(f, rel)))
    print(f"shortened trainings: runs of >= {SCALE_MIN_STEPS} steps train 1/{SCALE} of them, "
          f"{', '.join(STEP_KEYS)} divided by {SCALE} (rounded up); everything else as written",
          flush=True)

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_MCA_rmaps_base_oversubscribe"))}
    env["OMPI_MCA_orte_tmpdir_base"] = str(session)
    env["PATH"] = f"{scratch / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    preamble = root_exports(args.source / "README.md") if os.getuid() == 0 else ""
    if preamble:
        print(f"as root: {preamble} (README.md)", flush=True)

    train_sets, skipped, runnable = {}, [], []
    for rel, blocks in plan:
        steps, files_here = [], []
        for b in blocks:
            kind, what = parse_marker(b)
            if kind == "skip":
                skipped.append((b, what))
            elif kind == "file":
                name, sets, reason = what
                files_here.append((b, name))
                if sets:
                    train_sets[str(scratch / name)] = sets
                    print(f"{b.where()}: {name}: trains add --set {' --set '.join(sets)} "
                          f"({reason})", flush=True)
            else:
                steps += [(b, line, text) for line, text in b.commands()]
        runnable.append((rel, steps, files_here))
    env["LLMT_DOCS_TRAIN_SETS"] = json.dumps(train_sets)
    for b, reason in skipped:
        print(f"skip {b.where()} ({reason}):", flush=True)
        for _, text in b.commands():
            print("    $ " + " ".join(text.replace("\\\n", " ").split()), flush=True)

    prepare(args, scratch, env, preamble)
    failures, n_passed, n_all = [], 0, 0
    for rel, steps, files_here in runnable:
        for b, name in files_here:
            (scratch / name).write_text("\n".join(b.body) + "\n")
            print(f"{b.where()}: wrote the block to {name}", flush=True)
        if not steps:
            continue
        print(f"{rel}: {len(steps)} commands", flush=True)
        failed, passed = run_file(rel, steps, scratch, env, preamble)
        failures += failed
        n_passed += passed
        n_all += len(steps)
    print(f"{n_passed} of {n_all} commands passed ({sum(1 for _, s, _ in runnable if s)} files), "
          f"{len(skipped)} blocks skipped, {time.time() - start:.0f} s", flush=True)
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    main()
