#!/usr/bin/env bash
# Proves that the GPU kit needs nothing of the machine that built it: runs KIT_DIR/run.sh in a
# chroot that holds only the base C library, bash and the commands run.sh calls (with their own
# libraries), the kit, and NVIDIA's libraries of the CUDA toolkit, mounted read-only at
# /usr/local/cuda where a GPU machine's toolkit would be. No Debian development package, no
# Open MPI, HDF5 or OpenBLAS is visible inside. Without a GPU, run.sh must pass `version` and
# `libs`, run the CPU half of `train`, and report the GPU steps as skipped.
#
#   scripts/gpu/check_kit.sh [KIT_DIR] [OUT_DIR]    defaults: .gpu-kit, ./gpu-kit-check
#
# Needs root (a mount namespace and chroot). Exit status: run.sh's, or 1 when the summary is not
# what a machine without a GPU must give.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kit="$(realpath "${1:-$here/../../.gpu-kit}")"
out="$(realpath -m "${2:-./gpu-kit-check}")"
cuda="$(realpath /usr/local/cuda)"
[[ -f "$kit/run.sh" && -f "$kit/kit.tar.gz" ]] || { echo "no kit in $kit: run scripts/gpu/kit.sh" >&2; exit 1; }
[[ -d "$cuda/lib" || -d "$cuda/lib64" ]] || { echo "no CUDA toolkit at /usr/local/cuda" >&2; exit 1; }

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{usr/bin,usr/lib,usr/lib64,usr/local/cuda,proc,dev,sys,tmp,kit,out} "$out"
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
chmod 1777 "$root/tmp"
# The commands run.sh calls, and the libraries each links.
for cmd in bash sh env mkdir mktemp tar gzip cat tee date sleep awk timeout tail head grep sort \
  basename dirname realpath ldd ls cp rm tr sed; do
  src="$(command -v "$cmd")"
  cp -L "$src" "$root/usr/bin/$cmd"
  { ldd "$src" 2>/dev/null || true; } | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    [[ -e "$root$lib" ]] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
  done
done
# The whole base C library (kit_libs.sh's KIT_BASE_LIBS), which every Linux machine has.
source "$here/kit_libs.sh"
for lib in "${KIT_BASE_LIBS[@]}"; do
  for d in /lib/x86_64-linux-gnu /lib64; do
    [[ -e "$d/$lib" && ! -e "$root$d/$lib" ]] && { mkdir -p "$root$d"; cp -L "$d/$lib" "$root$d/$lib"; }
  done
done
cp -r "$kit/." "$root/kit/"

unshare -m bash -s "$root" "$cuda" "$out" <<'INNER'
set -euo pipefail
root="$1" cuda="$2" out="$3"
mount --bind "$cuda" "$root/usr/local/cuda"
mount -o remount,bind,ro "$root/usr/local/cuda"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind /sys "$root/sys"
mount --bind "$out" "$root/out"
chroot "$root" /usr/bin/env -i PATH=/usr/bin HOME=/tmp /usr/bin/bash /kit/run.sh /out || true
INNER

echo "==> the summary inside the chroot ($out/summary.txt):"
cat "$out/summary.txt"
ok=1
grep -q '^version  *pass' "$out/summary.txt" || ok=0
grep -q '^libs  *pass' "$out/summary.txt" || ok=0
grep -q '^train  *skipped.*the CPU run above passed' "$out/summary.txt" || ok=0
grep -q ' fail ' "$out/summary.txt" && ok=0
if [[ $ok -eq 1 ]]; then
  echo "check_kit: the kit ran in the chroot: version and libs passed, train's CPU half passed, GPU steps skipped"
else
  echo "check_kit: the kit did not run as it must in the chroot (summary above; logs in $out)" >&2
  exit 1
fi
