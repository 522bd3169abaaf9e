#!/usr/bin/python3
"""The shipped paper setups (configs/papers/*.toml) stay valid: each passes `config validate` at
the world size its header names ("# world: N"), `llmtrain plan` runs on it without MPI, and the
parameter count plan prints matches the published one to the publication's rounding (exact
Hugging Face counts for GPT-2 and Llama, the papers' tables for the Megatron models). Each names
its hardware and world in [plan] (the world the header's), and `llmtrain plan` without flags
finds it fits that hardware, but for the configs listed in DOES_NOT_FIT, whose headers say why.
Usage: check_paper_configs.py --llmtrain BIN --dir configs/papers"""
import argparse
import glob
import os
import re
import subprocess
import sys

# file: (published parameter count as printed, the source). A count with a decimal point is
# compared after rounding ours to the same digits, in billions.
PUBLISHED = {
    "gpt2-124m.toml": ("124439808", "Hugging Face gpt2"),
    "gpt2-350m.toml": ("354823168", "Hugging Face gpt2-medium"),
    "gpt2-774m.toml": ("774030080", "Hugging Face gpt2-large"),
    "gpt2-1558m.toml": ("1557611200", "Hugging Face gpt2-xl"),
    "megatron-8.3b.toml": ("8.3", "Shoeybi et al. 2019, Table 1"),
    "ptdp-gpt3-175b.toml": ("175", "Brown et al. 2020, Table 2.1"),
    "ptdp-1t.toml": ("1008.0", "Narayanan et al. 2021, Table 1"),
    "mt-nlg-530b.toml": ("529.6", "Narayanan et al. 2021, Table 1 (the 530B row)"),
    "llama2-7b.toml": ("6738415616", "Hugging Face Llama-2-7b"),
    "llama2-70b.toml": ("68976648192", "Hugging Face Llama-2-70b"),
    "llama3-8b.toml": ("8030261248", "Hugging Face Meta-Llama-3-8B"),
    "llama3-70b.toml": ("70553706496", "Hugging Face Meta-Llama-3-70B"),
    "llama3-405b.toml": ("405853388800", "Hugging Face Llama-3.1-405B"),
    "llama3-405b-128k.toml": ("405853388800", "Hugging Face Llama-3.1-405B"),
    "mixtral-8x7b.toml": ("46702792704", "Hugging Face Mixtral-8x7B-v0.1"),
    "deepseekmoe-16b.toml": ("16.4", "Dai et al. 2024, §5 and its model card (\"16.4B\")"),
    "deepseek-v3.toml": ("671", "DeepSeek-AI 2024, §1 (\"671B total parameters\"; its 14B of "
                                "multi-token prediction counted apart)"),
}
# Sizes a paper names without counting them: (billions, the source, how far ours may be and why).
NOMINAL = {
    "zero-100b.toml": (100, "Rajbhandari et al. 2020, Table 4 (\"100B\", the size it names)", 0.015,
                       "12 L h^2 = 100.7B for 125 layers of 8192, plus 0.4B of embeddings"),
}
# Configs with no published count of their own, and why.
UNPUBLISHED = {
    "switch-base-128.toml": "the paper's 7B counts Switch-Base's encoder and decoder; this is one "
                            "decoder-only stack of its shape",
}
# Published layouts that do not fit their hardware in llmtrain yet (plan without flags prints
# DOES NOT FIT; the config's header says why, in a sentence with "does not fit").
DOES_NOT_FIT = {}
# Mixture-of-experts configs: the active parameters per token, in billions (plan's "N active").
PUBLISHED_ACTIVE = {
    "mixtral-8x7b.toml": ("12.9", "Jiang et al. 2024, Section 1 (13B active; 12.9B on the model card)"),
    "deepseekmoe-16b.toml": ("2.8", "Dai et al. 2024, §5 and its model card (\"2.8B\" activated)"),
}
# Active counts a paper rounds further: (billions, the source, how far ours may be and why).
NOMINAL_ACTIVE = {
    "deepseek-v3.toml": (37, "DeepSeek-AI 2024, §1 (\"37B activated for each token\")", 0.02,
                         "37.55B counting the input embedding, 36.63B without it"),
}


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmtrain", required=True)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    failures = []
    files = sorted(glob.glob(os.path.join(args.dir, "*.toml")))
    names = {os.path.basename(f) for f in files}
    for missing in sorted((set(PUBLISHED) | set(NOMINAL) | set(UNPUBLISHED)) - names):
        failures.append(f"{missing}: listed here but not in {args.dir}")
    for f in files:
        name = os.path.basename(f)
        with open(f) as fh:
            text = fh.read()
        m = re.search(r"^# world: (\d+)", text, re.M)
        if not m:
            failures.append(f"{name}: no '# world: N' line in its header")
            continue
        world = m.group(1)
        planned = text[text.find("\n[plan]"):] if "\n[plan]" in text else ""
        pw = re.search(r"^world = (\d+)", planned, re.M)
        ph = re.search(r'^hardware = "([^"]+)"', planned, re.M)
        if not pw or not ph or pw.group(1) != world:
            failures.append(f"{name}: [plan] must name its hardware and the world {world}")
            continue
        rc, out = run([args.llmtrain, "plan", "--config", f])
        fits = rc == 0 and "DOES NOT FIT" not in out
        if rc != 0:
            failures.append(f"{name}: plan without flags exits {rc}:\n{out}")
        elif name in DOES_NOT_FIT:
            header = text[:text.find("\n[")]
            print(f"{name}: at world {world} on {ph.group(1)}: does not fit "
                  f"({DOES_NOT_FIT[name]})")
            if fits:
                failures.append(f"{name}: now fits {ph.group(1)}: remove it from DOES_NOT_FIT")
            if "does not fit" not in header.lower():
                failures.append(f"{name}: does not fit {ph.group(1)}, and its header does not "
                                f"say why")
        elif not fits:
            failures.append(f"{name}: plan without flags: DOES NOT FIT {ph.group(1)} at world "
                            f"{world}")
        else:
            print(f"{name}: fits {ph.group(1)} at world {world}")
        rc, out = run([args.llmtrain, "config", "validate", "--config", f, "--world", world])
        if rc != 0:
            failures.append(f"{name}: config validate --world {world} exits {rc}:\n{out}")
            continue
        rc, out = run([args.llmtrain, "plan", "--config", f, "--world", world])
        p = re.search(r"^parameters: (\d+)", out, re.M)
        if rc != 0 or not p:
            failures.append(f"{name}: plan --world {world} exits {rc}:\n{out}")
            continue
        count = int(p.group(1))
        if name in UNPUBLISHED:
            print(f"{name}: world {world} valid; {count} parameters, no published count "
                  f"({UNPUBLISHED[name]})")
            continue
        if name in NOMINAL:
            want, source, tol, why = NOMINAL[name]
            off = count / (want * 1e9) - 1
            ok = abs(off) <= tol
            print(f"{name}: world {world} valid; {count} parameters, {off:+.2%} from the nominal "
                  f"{want}B ({source}; {why}) {'OK' if ok else 'MISMATCH'}")
            if not ok:
                failures.append(f"{name}: {count} parameters, {off:+.2%} from the nominal {want}B")
            continue
        if name not in PUBLISHED:
            failures.append(f"{name}: no published parameter count listed in this script")
            continue
        want, source = PUBLISHED[name]
        if len(want) < 7:  # billions, to the published digits
            digits = len(want.split(".")[1]) if "." in want else 0
            ours = f"{count / 1e9:.{digits}f}"
        else:
            ours = str(count)
        if name in PUBLISHED_ACTIVE:
            a = re.search(r"^parameters: \d+ \((\d+) active", out, re.M)
            want_a, source_a = PUBLISHED_ACTIVE[name]
            got_a = f"{int(a.group(1)) / 1e9:.1f}" if a else "none"
            print(f"{name}: {a.group(1) if a else '?'} active parameters -> {got_a}, published "
                  f"{want_a} ({source_a})")
            if got_a != want_a:
                failures.append(f"{name}: active parameters {got_a}, published {want_a} ({source_a})")
        if name in NOMINAL_ACTIVE:
            a = re.search(r"^parameters: \d+ \((\d+) active", out, re.M)
            want_a, source_a, tol, why = NOMINAL_ACTIVE[name]
            off = int(a.group(1)) / (want_a * 1e9) - 1 if a else float("inf")
            print(f"{name}: {a.group(1) if a else '?'} active parameters, {off:+.2%} from the "
                  f"published {want_a}B ({source_a}; {why})")
            if not abs(off) <= tol:
                failures.append(f"{name}: active parameters {off:+.2%} from {want_a}B")
        status = "OK" if ours == want else "MISMATCH"
        print(f"{name}: world {world} valid; {count} parameters -> {ours}, published {want} "
              f"({source}) {status}")
        if ours != want:
            failures.append(f"{name}: {count} parameters ({ours}), published {want} ({source})")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
