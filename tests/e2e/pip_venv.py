"""Python packages Debian does not ship, for the e2e checks that need them (TensorBoard's reader,
transformers): pip installs them into a venv made with --system-site-packages under
$LLMT_CACHE (default ~/.cache/llmtrain), outside the checkout, so that a later run, or a fresh
clone on the same machine, reuses it. Exits 77 (skipped) when pip cannot install them here."""
import os
import shutil
import subprocess
import sys


def venv_python(name, packages, probe, pip_args=()):
    """The venv `name`'s python, with `packages` installed unless `probe` (Python source) already
    runs there."""
    root = os.environ.get("LLMT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "llmtrain"))
    venv = os.path.join(root, name)
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", probe], capture_output=True).returncode == 0:
        return py
    shutil.rmtree(venv, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
    r = subprocess.run([py, "-m", "pip", "install", "-q", *pip_args, *packages],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIP: pip cannot install {' '.join(packages)} here:\n{r.stdout}{r.stderr}")
        sys.exit(77)
    return py
