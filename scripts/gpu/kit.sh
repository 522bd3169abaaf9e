#!/usr/bin/env bash
# Builds the CUDA build (sm_80 and sm_90) and packs the GPU kit: everything a GPU machine with
# NVIDIA's libraries but no Debian packages, compilers or network needs to run the GPU suite and
# the GPU benchmark in one command (docs/gpu.md, "Running the kit").
#
#   scripts/gpu/kit.sh [KIT_DIR]        default KIT_DIR: .gpu-kit (ignored by git)
#   scripts/gpu/kit.sh --check BINARY...  only checks that kit_libs.sh covers the binaries' libraries
#
# KIT_DIR gets run.sh and kit.tar.gz, which holds bin/ (llmtrain and the three GPU test programs,
# stripped), lib/ (the Debian libraries of kit_libs.sh's KIT_LIBS, as this machine resolves
# them), configs/ and scripts/bench/ (what the steps of run.sh read) and BUILD-INFO (commit,
# CUDA architectures, and the versions of NVIDIA's libraries the build compiled against).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../common.sh"
source "$here/kit_libs.sh"

if [[ "${1:-}" == --check ]]; then
  shift
  missing="$(kit_uncovered "$@")"
  if [[ -n "$missing" ]]; then
    echo "scripts/gpu/kit_libs.sh does not list these libraries of $*:" >&2
    echo "$missing" | sed 's/^/  /' >&2
    echo "add each to KIT_LIBS (a Debian library to pack) or KIT_NVIDIA_LIBS" >&2
    exit 1
  fi
  echo "kit_libs.sh covers every library of $*"
  exit 0
fi

kit="$(realpath -m "${1:-$LLMT_ROOT/.gpu-kit}")"
nvcc="$(llmt_nvcc)"
if [[ -z "$nvcc" ]]; then
  echo "kit.sh: no CUDA toolkit (nvcc) on PATH or in /usr/local/cuda: the kit needs the CUDA build" >&2
  exit 1
fi
llmt_install_deps
archs="${LLMT_KIT_ARCHS:-80;90}"
# The CUDA build of scripts/test.sh (same folder and flags, so each reuses the other's objects;
# without oneDNN, the CPU's bf16 GEMMs, whose 40 MB the kit would carry for nothing).
LLMT_TARGETS="llmtrain test_gpu test_gpu_ops test_gpu_train" llmt_build "$LLMT_ROOT/build-cuda" \
  -DLLMTRAIN_CUDA=ON -DLLMTRAIN_WERROR=ON -DLLMTRAIN_DNNL=OFF -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_CUDA_ARCHITECTURES="$archs"
bins=("$LLMT_ROOT/build-cuda/app/llmtrain")
for t in test_gpu test_gpu_ops test_gpu_train; do bins+=("$LLMT_ROOT/build-cuda/tests/gpu/$t"); done
"$here/kit.sh" --check "${bins[@]}"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,lib,configs,scripts/bench}
for b in "${bins[@]}"; do strip -o "$stage/bin/$(basename "$b")" "$b"; done
# Each KIT_LIBS library where the binaries' ldd resolves it (its real file, under its soname).
declare -A path
while read -r name _ file _; do
  [[ "$file" == /* ]] && path[$name]="$file"
done < <(for b in "${bins[@]}"; do ldd "$b"; done)
for lib in "${KIT_LIBS[@]}"; do
  [[ -n "${path[$lib]:-}" ]] || continue  # listed, but not linked by this build
  strip --strip-unneeded -o "$stage/lib/$lib" "$(realpath "${path[$lib]}")"
done
cp "$LLMT_ROOT"/configs/{quickstart.toml,quickstart-synthetic.toml,gpt2-124m.toml} "$stage/configs/"
cp "$LLMT_ROOT"/scripts/bench/{bench_gpu.sh,common.sh,runs.py} "$stage/scripts/bench/"
cp "$here/kit_libs.sh" "$stage/"

# Versions of NVIDIA's libraries this build compiled against, from their headers.
header_version() {  # FILE MACRO...: the values of the macros, joined by dots
  local file="$1" out=() m
  shift
  for m in "$@"; do out+=("$(awk -v m="$m" '$1 == "#define" && $2 == m {print $3; exit}' "$file")"); done
  (IFS=.; echo "${out[*]}")
}
inc="$(dirname "$(dirname "$nvcc")")/include"
cudart="$(awk '$2 == "CUDART_VERSION" {print $3; exit}' "$inc/cuda_runtime_api.h")"
{
  echo "commit $(git -C "$LLMT_ROOT" rev-parse --short HEAD)$(git -C "$LLMT_ROOT" diff --quiet HEAD || echo +changes)"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m), CUDA architectures $archs"
  echo "cudart $((cudart / 1000)).$((cudart % 1000 / 10))"
  echo "cublas $(header_version "$inc/cublas_api.h" CUBLAS_VER_MAJOR CUBLAS_VER_MINOR CUBLAS_VER_PATCH)"
  echo "cudnn $(header_version "$inc/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)"
  echo "nccl $(header_version "$inc/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)"
} > "$stage/BUILD-INFO"

rm -rf "$kit"
mkdir -p "$kit"
tar -C "$stage" -czf "$kit/kit.tar.gz" .
cp "$here/run.sh" "$kit/run.sh"
size=$(du -cb "$kit" | tail -1 | cut -f1)
echo "==> GPU kit in $kit: $((size / 1024 / 1024)) MiB ($(wc -l < <(ls "$stage/lib")) libraries)"
sed 's/^/    /' "$stage/BUILD-INFO"
if ((size > 56 * 1024 * 1024)); then
  echo "kit.sh: the kit is over 56 MiB; with the working tree it must travel in 64 MiB" >&2
  exit 1
fi
