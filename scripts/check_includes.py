#!/usr/bin/python3
# check_includes: every project `#include "..."` in the source folders must name a header of a folder
# at or below its own in the layer order (docs/architecture.md, "Layers") and of a library that the
# including file's library links (the link lists are the dependency graph), so an include that
# points up fails CI instead of building by accident.
"""Rules (the layer order below is the design's; all other facts come from a CMake configure):

* Layers, top to bottom: app; train, plan; data, checkpoints; engine; kernels; core, config
  (LAYERS). A file may include a header of its own layer or one below, never one above, whatever
  the link lists say: adding an upward link does not make an upward include legal.
* A compiled .cpp/.cu belongs to the target in its object path (CMakeFiles/<target>.dir/) in
  compile_commands.json. The project's targets are llmt_* and the llmtrain executable.
* Links: cmake --graphviz (deps.dot), whose edges are solid (PUBLIC), dotted (PRIVATE) or dashed
  (INTERFACE). Library A may include the headers of A, of each target it links PUBLIC or PRIVATE,
  and of all those reach through PUBLIC/INTERFACE edges (CMake's usage requirements: a PRIVATE
  link is not passed on to A's dependers).
* A header (any included file) belongs to the library of the compiled source with its stem in its
  folder, else to the library of most compiled sources directly in its folder, else to the nearest
  enclosing folder's (a header-only folder).
* Skipped (listed by --verbose): sources the configuration does not compile (kernels/cuda/*.cu,
  nccl/ without LLMTRAIN_CUDA), headers of a folder with sources but none compiled (a CUDA-only
  folder), and .cuh files when no .cu is compiled. They still get a library, so a compiled file
  that includes one is checked.
* A quoted include resolves like the compiler's: the including file's folder, then the repo root.
"""
import argparse, collections, json, os, re, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Top-level source folders by layer, highest first: a folder includes only its layer or lower.
LAYERS = [["app"], ["train", "plan"], ["data", "checkpoints"], ["engine"], ["kernels"],
          ["core", "config"]]
LAYER_OF = {folder: len(LAYERS) - i for i, folders in enumerate(LAYERS) for folder in folders}
SCAN_ROOTS = [folder for folders in LAYERS for folder in folders]
SOURCE_EXT, HEADER_EXT = {".cpp", ".cc", ".cu"}, {".h", ".hpp", ".cuh", ".inc"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
OBJ_RE = re.compile(r"(?:^|[\s/])CMakeFiles/([^/\s]+)\.dir/")
NODE_RE = re.compile(r'^\s*"(node\d+)"\s*\[\s*label\s*=\s*"([^"]*)"')
EDGE_RE = re.compile(r'^\s*"(node\d+)"\s*->\s*"(node\d+)"\s*(?:\[\s*style\s*=\s*(\w+)\s*\])?')


def is_project(target):
    return target.startswith("llmt_") or target == "llmtrain"


def configure(build, cuda):
    cmd = ["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", f"-DLLMTRAIN_CUDA={cuda}",
           "-DLLMTRAIN_TESTS=OFF", f"--graphviz={build}/deps.dot"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"check_includes: cmake configure failed:\n{r.stdout}{r.stderr}")


def cache_value(build, key, default):
    cache = Path(build) / "CMakeCache.txt"
    for line in (cache.read_text().splitlines() if cache.exists() else []):
        if line.startswith(key + ":"):
            return line.split("=", 1)[1]
    return default


def source_targets(build):
    """{repo-relative source: target} for the project's compiled sources."""
    out = {}
    for e in json.loads((Path(build) / "compile_commands.json").read_text()):
        cmd = e.get("output") or e.get("command") or " ".join(e.get("arguments", []))
        m = OBJ_RE.search(cmd)
        rel = os.path.relpath(os.path.join(e["directory"], e["file"]), ROOT)
        if m and is_project(m.group(1)) and not rel.startswith(("..", "tests/")):
            out.setdefault(rel, m.group(1))
    return out


def link_closure(dot):
    """{target: set of project targets whose headers it may include}."""
    names, edges = {}, collections.defaultdict(list)
    for line in Path(dot).read_text().splitlines():
        if m := NODE_RE.match(line):
            names[m.group(1)] = m.group(2)
        elif (m := EDGE_RE.match(line)) and not m.group(1).startswith("legend"):
            edges[m.group(1)].append((m.group(2), m.group(3) or "solid"))
    edges = {names[a]: [(names[b], s) for b, s in bs] for a, bs in edges.items() if a in names}

    def propagated(t, seen):  # t and what it passes on: PUBLIC (solid) and INTERFACE (dashed) links
        if t not in seen:
            seen.add(t)
            for b, style in edges.get(t, []):
                if style in ("solid", "dashed"):
                    propagated(b, seen)
        return seen

    closure = {}
    for t in names.values():
        if is_project(t):
            seen = {t}
            for b, style in edges.get(t, []):
                if style in ("solid", "dotted"):
                    propagated(b, seen)
            closure[t] = {x for x in seen if is_project(x)}
    return closure


def header_library(rel, by_dir):
    """Library of a non-compiled file: same-stem source, folder majority, enclosing folder."""
    folder, stem = os.path.dirname(rel), Path(rel).stem
    for src, tgt in by_dir.get(folder, []):
        if Path(src).stem == stem:
            return tgt
    while True:
        if by_dir.get(folder):
            return collections.Counter(t for _, t in by_dir[folder]).most_common(1)[0][0]
        if not folder:
            return None
        folder = os.path.dirname(folder)


def resolve(include, rel):
    for cand in (os.path.join(os.path.dirname(rel), include), include):
        cand = os.path.normpath(cand)
        if not cand.startswith("..") and (ROOT / cand).is_file():
            return cand
    return None


def main():
    ap = argparse.ArgumentParser(description="Project includes against the CMake link graph.",
                                 epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", help="a configured tree: reuse its compile_commands.json and "
                    "deps.dot (without deps.dot, a scratch tree is configured for the link graph)")
    ap.add_argument("--verbose", action="store_true",
                    help="print the header -> library map, the skipped files and the link closure")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="check_includes.") as tmp:
        build = Path(args.build_dir).resolve() if args.build_dir else Path(tmp)
        if not args.build_dir:
            configure(build, "OFF")
        elif not (build / "compile_commands.json").exists():
            sys.exit(f"check_includes: no {build}/compile_commands.json (configure it first)")
        dot = build / "deps.dot"
        if not dot.exists():  # configured without --graphviz: configure a scratch tree like it
            configure(Path(tmp) / "graph", cache_value(build, "LLMTRAIN_CUDA", "OFF"))
            dot = Path(tmp) / "graph" / "deps.dot"
        sources, closure = source_targets(build), link_closure(dot)
    if not sources:
        sys.exit(f"check_includes: {build}/compile_commands.json compiles no source of {ROOT}")

    by_dir = collections.defaultdict(list)
    for src, tgt in sorted(sources.items()):
        by_dir[os.path.dirname(src)].append((src, tgt))
    files = sorted(str(p.relative_to(ROOT)) for r in SCAN_ROOTS for p in (ROOT / r).rglob("*")
                   if p.suffix in SOURCE_EXT | HEADER_EXT and p.is_file())
    files += sorted(s for s in sources if s not in files)  # a library's sources outside SCAN_ROOTS
    have_cu = any(s.endswith(".cu") for s in sources)
    unbuilt_dirs = {os.path.dirname(f) for f in files if Path(f).suffix in SOURCE_EXT} - set(by_dir)

    lib_of, skipped, header_map = {}, [], {}
    for f in files:
        if f in sources:
            lib_of[f] = sources[f]
        elif Path(f).suffix in SOURCE_EXT:
            skipped.append(f"{f}: not compiled in this configuration")
        elif os.path.dirname(f) in unbuilt_dirs or (f.endswith(".cuh") and not have_cu):
            skipped.append(f"{f}: header of a folder not compiled in this configuration")
        elif (lib := header_library(f, by_dir)) is None:
            skipped.append(f"{f}: no library compiles a source in or above its folder")
        else:
            lib_of[f] = header_map[f] = lib

    n_includes, violations = 0, []
    order = " > ".join("/".join(folders) for folders in LAYERS)
    for f in files:  # every file, compiled here or not: the layer rule needs no library
        lib = lib_of.get(f)
        for lineno, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1):
            m = INCLUDE_RE.match(line)
            target = m and resolve(m.group(1), f)
            if not target:
                continue
            n_includes += 1
            top, target_top = f.split("/", 1)[0], target.split("/", 1)[0]
            if LAYER_OF.get(target_top, 0) > LAYER_OF.get(top, len(LAYERS) + 1):
                violations.append(f'{f}:{lineno}: includes "{m.group(1)}" of {target_top}/, a '
                                  f"layer above {top}/ ({order}): move the code down or the "
                                  "caller up")
                continue
            hlib = lib and (sources.get(target) or header_library(target, by_dir))
            if not hlib or hlib == lib or hlib in closure.get(lib, ()):
                continue
            violations.append(f'{f}:{lineno}: includes "{m.group(1)}" of {hlib}, but {f}\'s '
                              f"library {lib} does not link {hlib}: add {hlib} to {lib}'s "
                              "target_link_libraries or move the code")
    if args.verbose:
        for h, l in sorted(header_map.items()):
            print(f"header {h} -> {l}")
        for s in skipped:
            print(f"skipped {s}")
        for t in sorted(closure):
            print(f"links {t} -> {' '.join(sorted(closure[t] - {t})) or '-'}")
    for v in violations:
        print(v)
    print(f"check_includes: {len(files)} files, {n_includes} project includes, "
          f"{len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
