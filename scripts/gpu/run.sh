#!/usr/bin/env bash
# The GPU kit's runner (scripts/gpu/kit.sh packs it next to kit.tar.gz): runs the GPU suite and
# the GPU benchmark on a machine with an NVIDIA GPU, its driver and NVIDIA's libraries (PyTorch's
# pip packages or the CUDA toolkit), and nothing else of ours. docs/gpu.md, "Running the kit".
#
#   bash .gpu-kit/run.sh [OUT_DIR]      default OUT_DIR: ./gpu-out
#
# Steps, each time-boxed, each with its log in OUT_DIR (NN-step.log) and one summary line
# (pass/fail/skipped, seconds) at the end and in OUT_DIR/summary.txt:
#   version  llmtrain --version, the GPU, and NVIDIA's libraries against the kit's build
#   libs     ldd: every library resolved from the kit, NVIDIA's folders or the base C library
#   gpu-ops, gpu-train, gpu-device   the GPU test programs (ctest label gpu): op cases CPU vs GPU,
#            short trainings CPU vs GPU, device memory and copies
#   train    configs/quickstart-synthetic.toml, 50 steps on the GPU and on the CPU, loss per step
#   bench    scripts/bench/bench_gpu.sh: GPT-2 124M fp32 and bf16, tokens/s, MFU, peak memory
#   memory   a 6.5B-parameter run on one GPU: must be refused before allocating (exit 2)
#   train-bf16  train's comparison in bf16 (tensor cores, cuDNN attention)
#   resume   a checkpoint saved on the GPU resumes on the CPU and one saved on the CPU on the GPU
#   sanitize compute-sanitizer: memcheck of the op cases and short trainings, racecheck of the
#            op cases that run our kernels
# Without a GPU the GPU steps say "skipped" and why; version, libs and train's CPU half still run.
# Exit status: 0 when no step failed.
# Environment: LLMT_KIT_WORK (where the kit unpacks; default a new folder under /tmp),
# LLMT_KIT_STEPS (space-separated names of the steps to run; default all).
set -uo pipefail
kit_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-./gpu-out}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="${LLMT_KIT_WORK:-$(mktemp -d /tmp/llmtrain-kit.XXXXXX)}"
mkdir -p "$work"
tar -C "$work" -xzf "$kit_dir/kit.tar.gz" || { echo "run.sh: cannot unpack $kit_dir/kit.tar.gz" >&2; exit 1; }
source "$work/kit_libs.sh"
bin="$work/bin"
export OMP_WAIT_POLICY=passive
: > "$out/summary.txt"

# --- NVIDIA's libraries: the first folder holding each, from the pip packages of python3 (as
# PyTorch installs them), then the CUDA toolkit.
search=()
if command -v python3 >/dev/null 2>&1; then
  while read -r d; do search+=("$d"); done < <(python3 - 2>/dev/null <<'PY'
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        if os.path.realpath(d) not in seen:
            seen.append(os.path.realpath(d))
            print(d)
PY
  )
fi
for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"} /usr/local/cuda/lib64 /usr/local/cuda/lib \
  /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && search+=("$d")
done
libpath="$work/lib"
declare -A found
missing=()
for lib in "${KIT_NVIDIA_LIBS[@]}"; do
  for d in "${search[@]}"; do
    if [[ -e "$d/$lib" ]]; then
      found[$lib]="$d/$lib"
      [[ ":$libpath:" == *":$d:"* ]] || libpath+=":$d"
      break
    fi
  done
  [[ -n "${found[$lib]:-}" ]] || missing+=("$lib")
done
# The driver's folder, where a container runtime mounts it outside the loader's cache.
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [[ -d "$d" ]] && libpath+=":$d"; done
export LD_LIBRARY_PATH="$libpath"

# The version of a found NVIDIA library: its file name's (libcudnn.so.9.19.0), else its pip
# package's (site-packages/nvidia_cudnn_cu13-9.19.0.56.dist-info).
lib_version() {
  local file="$1" real v pkg
  real="$(basename "$(realpath "$file")")"
  v="${real#*.so.}"
  if [[ "$v" == *.*.* ]]; then echo "$v"; return; fi
  case "$(basename "$file")" in
    libcudart*) pkg=nvidia_cuda_runtime ;; libcublas*) pkg=nvidia_cublas ;;
    libcudnn*) pkg=nvidia_cudnn_cu13 ;; libnccl*) pkg=nvidia_nccl_cu13 ;;
    libnvrtc*) pkg=nvidia_cuda_nvrtc ;; *) pkg=none ;;
  esac
  local site dir
  dir="$(dirname "$file")"
  for site in "$dir/../.." "$dir/../../.." "$dir/.." "$dir/../dist-info"; do
    for v in "$site/$pkg"-*.dist-info; do
      [[ -d "$v" ]] && { v="${v##*/$pkg-}"; echo "${v%.dist-info}"; return; }
    done
  done
  echo unknown
}
# built_version NAME: the version BUILD-INFO records for cudart, cublas, cudnn or nccl.
built_version() { awk -v n="$1" '$1 == n {print $2}' "$work/BUILD-INFO"; }
older() { [[ "$1" != "$2" && "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" == "$1" ]]; }

gpu=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0)"
  no_gpu=""
elif command -v nvidia-smi >/dev/null 2>&1; then
  no_gpu="nvidia-smi lists no GPU"
else
  no_gpu="no NVIDIA driver (nvidia-smi not found)"
fi

# --- Steps.
n=0
failed=0
summary() { echo "$1" | tee -a "$out/summary.txt" >/dev/null; }
# step NAME SECONDS FUNCTION: runs FUNCTION time-boxed, its output into NN-NAME.log and here.
# FUNCTION returns 0 (pass), 1 (fail) or 3 (skipped: its last line says why).
step() {
  local name="$1" limit="$2" fn="$3" log rc t0 t1 why=""
  if [[ -n "${LLMT_KIT_STEPS:-}" && " $LLMT_KIT_STEPS " != *" $name "* ]]; then return; fi
  n=$((n + 1))
  log="$out/$(printf '%02d' "$n")-$name.log"
  echo "==> $name (at most $limit s)"
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" bash -c "source '$work/state.sh'; $fn" > >(tee "$log") 2>&1
  rc=$?
  t1=$(date +%s.%N)
  sleep 0.2  # let tee finish the log
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
  case $rc in
    0) summary "$(printf '%-11s pass     %7s s' "$name" "$secs")" ;;
    3) why="$(tail -n 1 "$log")"
       summary "$(printf '%-11s skipped  %7s s  (%s)' "$name" "$secs" "$why")" ;;
    124|137) failed=1
       summary "$(printf '%-11s fail     %7s s  (time limit of %s s)' "$name" "$secs" "$limit")" ;;
    *) failed=1
       summary "$(printf '%-11s fail     %7s s  (exit %s; %s)' "$name" "$secs" "$rc" "$(basename "$log")")" ;;
  esac
}

version_step() {
  "$bin/llmtrain" --version || return 1
  echo "kit: $(tr '\n' ';' < "$work/BUILD-INFO")"
  echo "GPU 0: ${gpu:-none ($no_gpu)}"
  [[ -n "$gpu" ]] && nvidia-smi | head -n 4 | tail -n 2
  local lib v b pkg bad=0
  for lib in "${KIT_NVIDIA_LIBS[@]}"; do
    v="$(lib_version "${found[$lib]}")"
    case $lib in
      libcudart*) pkg=cudart ;; libcublas*) pkg=cublas ;; libcudnn*) pkg=cudnn ;;
      libnccl*) pkg=nccl ;; *) pkg="" ;;
    esac
    b="${pkg:+$(built_version "$pkg")}"
    if [[ -n "$b" && "$v" != unknown ]] && older "$v" "$b"; then
      echo "$lib $v from ${found[$lib]}: OLDER than the $b the kit was built against; calls it" \
        "lacks fail when made (update the package, or rebuild the kit against $v)"
      bad=1
    else
      echo "$lib ${v} from ${found[$lib]}${b:+ (built against $b)}"
    fi
  done
  return $bad
}
libs_step() {
  local b rc=0
  for b in "$bin"/*; do
    echo "--- $(basename "$b")"
    ldd "$b" | awk '{print "  " $0}'
    if ldd "$b" | grep -q "not found"; then rc=1; fi
  done
  # Every library from the kit, NVIDIA's folders, the driver or the base C library.
  local outside
  outside="$(for b in "$bin"/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u |
    while read -r name file; do
      case " ${KIT_BASE_LIBS[*]} " in *" $name "*) continue ;; esac
      case "$name" in libcuda.so.*) continue ;; esac
      [[ "$file" == "$work/lib/"* ]] && continue
      [[ -n "${found[$name]:-}" ]] && continue
      echo "  $name from $file"
    done)"
  if [[ -n "$outside" ]]; then
    echo "resolved outside the kit and NVIDIA's folders:"
    echo "$outside"
    rc=1
  fi
  return $rc
}
gpu_test() {  # PROGRAM
  if [[ -z "$gpu" ]]; then "$bin/$1" --gtest_brief=1 | tail -n 3; echo "no GPU: $no_gpu"; return 3; fi
  "$bin/$1" --gtest_brief=1 --gtest_color=no
}
gpu_ops_step() { gpu_test test_gpu_ops; }
gpu_train_step() { gpu_test test_gpu_train; }
gpu_device_step() { gpu_test test_gpu; }
# One training of the quickstart model on the synthetic source: DEVICE NAME [--set...].
quickstart() {
  local device="$1" name="$2"
  shift 2
  "$bin/llmtrain" train --config "$work/configs/quickstart-synthetic.toml" \
    --set train.steps=50 --set "train.device=\"$device\"" --set "train.run_dir=\"$work/$name\"" \
    --set "checkpoint.dir=\"$work/$name/checkpoints\"" --set log.interval=10 "$@"
}
# compare_losses A B BOUND FIRST: the loss of every step >= FIRST of run B's metrics.jsonl against
# run A's, relative; fails above BOUND or when B has no step >= FIRST.
compare_losses() {
  awk -v bound="$3" -v first="$4" -v a="$1" -v b="$2" '
    function field(line, key,   m) { match(line, "\"" key "\": [^,}]*"); return substr(line, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0 }
    FNR == NR { ref[field($0, "step")] = field($0, "loss"); rtok += field($0, "tokens_per_s"); rn++; next }
    { s = field($0, "step"); if (s < first) next
      l = field($0, "loss"); d = (l - ref[s]) / ref[s]; if (d < 0) d = -d
      if (d >= worst) { worst = d; at = s } last = s; tok += field($0, "tokens_per_s"); n++ }
    END { printf "loss, steps %d-%d: %s %.6f, %s %.6f at step %d; largest relative difference %.2e (step %d, bound %g); mean tokens/s %s %.0f, %s %.0f\n", first, last, b, l, a, ref[last], last, worst, at, bound, b, tok / n, a, rtok / rn
          exit (n > 0 && worst <= bound) ? 0 : 1 }' \
    "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl"
}
train_step() {
  quickstart cpu train-cpu || return 1
  if [[ -z "$gpu" ]]; then echo "no GPU: $no_gpu (the CPU run above passed)"; return 3; fi
  quickstart cuda train-cuda || return 1
  # fp32 on both, so only summation order differs: 2e-3 relative at every step is the bound
  # (6 steps of test_gpu_train hold 1e-4).
  compare_losses train-cpu train-cuda 2e-3 1
}
# The same in bf16: tensor-core GEMMs and cuDNN attention round where the CPU does not (one bf16
# ulp at an op boundary moves the run), so the bound is test_gpu_train's bf16 one, 2e-2.
train_bf16_step() {
  if [[ -z "$gpu" ]]; then echo "no GPU: $no_gpu"; return 3; fi
  quickstart cpu bf16-cpu --set 'train.precision="bf16"' || return 1
  quickstart cuda bf16-cuda --set 'train.precision="bf16"' || return 1
  compare_losses bf16-cpu bf16-cuda 2e-2 1
}
# A checkpoint written on the GPU resumes on the CPU, and one written on the CPU on the GPU:
# steps 11-20 after the resume against the run that stayed on the device that saved (fp32, so
# 1e-4: summation order over ten steps).
resume_step() {
  if [[ -z "$gpu" ]]; then echo "no GPU: $no_gpu"; return 3; fi
  local from to
  for from in cuda cpu; do
    to=$([[ $from == cuda ]] && echo cpu || echo cuda)
    quickstart "$from" "saved-$from" --set train.steps=20 --set checkpoint.interval=10 || return 1
    cp -r "$work/saved-$from" "$work/resumed-$to"
    rm -rf "$work/resumed-$to/checkpoints/step_00000020"
    echo "step_00000010" > "$work/resumed-$to/checkpoints/latest"
    quickstart "$to" "resumed-$to" --set train.steps=20 --set checkpoint.interval=10 \
      --set 'checkpoint.load="latest"' > "$work/resumed-$to.out" 2>&1
    local rc=$?
    cat "$work/resumed-$to.out"
    [[ $rc -eq 0 ]] && grep -q "^checkpoint: resumed from .*step_00000010 (step 10," \
      "$work/resumed-$to.out" || return 1
    echo "saved on $from at step 10, resumed on $to:"
    compare_losses "saved-$from" "resumed-$to" 1e-4 11 || return 1
  done
}
# compute-sanitizer's memcheck over the op cases and the short trainings, racecheck over the op
# cases of our own kernels (shared-memory tiles and reductions): any error fails the step.
sanitize_step() {
  if [[ -z "$gpu" ]]; then echo "no GPU: $no_gpu"; return 3; fi
  local cs
  cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)"
  if [[ -z "$cs" ]]; then echo "compute-sanitizer not found"; return 3; fi
  local args=(--error-exitcode 9 --print-limit 20)
  "$cs" --tool memcheck "${args[@]}" "$bin/test_gpu_ops" --gtest_brief=1 --gtest_color=no || return 1
  "$cs" --tool memcheck "${args[@]}" "$bin/test_gpu_train" --gtest_brief=1 --gtest_color=no || return 1
  # Not the cases that run cuDNN's attention (16-bit operands): racecheck reports hazards inside
  # cuDNN's own sm90 SDPA kernels (docs/gpu.md), which are not ours to fix.
  "$cs" --tool racecheck "${args[@]}" "$bin/test_gpu_ops" --gtest_brief=1 --gtest_color=no \
    --gtest_filter='-*_ops_bf16*:*_ops_f16*:Gpu.AttentionPath*' || return 1
}
bench_step() {
  if [[ -z "$gpu" ]]; then echo "no GPU: $no_gpu"; return 3; fi
  bash "$work/scripts/bench/bench_gpu.sh" "$bin/llmtrain" 20
}
memory_step() {
  if [[ -z "$gpu" ]]; then echo "no GPU: $no_gpu"; return 3; fi
  # GPT-2 with 32 layers of width 4096: 6.5B parameters, ~100 GiB of fp32 state and AdamW moments.
  "$bin/llmtrain" train --config "$work/configs/gpt2-124m.toml" --set 'train.device="cuda"' \
    --set model.n_layers=32 --set model.d_model=4096 --set model.n_heads=32 \
    --set "train.run_dir=\"$work/memory\"" > "$work/memory.out" 2>&1
  local rc=$?
  cat "$work/memory.out"
  [[ $rc -eq 2 ]] && grep -q "on GPU 0" "$work/memory.out" && ! grep -q "^step " "$work/memory.out"
}
# What a step's shell needs (timeout runs each step in a new bash): the variables and functions.
{ declare -p found KIT_BASE_LIBS KIT_NVIDIA_LIBS bin work out gpu no_gpu LD_LIBRARY_PATH; declare -f; } > "$work/state.sh"

echo "llmtrain GPU kit: $(head -n 1 "$work/BUILD-INFO"), output in $out"
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "run.sh: NVIDIA libraries not found: ${missing[*]}" | tee -a "$out/summary.txt" >&2
  echo "  looked in: ${search[*]:-(no python3 pip packages, no CUDA toolkit)}" | tee -a "$out/summary.txt" >&2
  echo "  install PyTorch's CUDA 13 pip packages or the CUDA 13 toolkit with cuDNN 9 and NCCL 2," \
    "or set CUDA_HOME" | tee -a "$out/summary.txt" >&2
  exit 1
fi
step version 30 version_step
step libs 30 libs_step
step gpu-device 30 gpu_device_step
step gpu-ops 90 gpu_ops_step
step gpu-train 90 gpu_train_step
step train 60 train_step
step bench 120 bench_step
step memory 30 memory_step
step train-bf16 60 train_bf16_step
step resume 60 resume_step
step sanitize 240 sanitize_step
echo "==> summary ($out/summary.txt)"
cat "$out/summary.txt"
exit $failed
