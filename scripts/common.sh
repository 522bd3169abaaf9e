# Shared by the setup, quickstart and test scripts: dependency install and the CPU build.
# Sourced, not run. Debian packages only (docs/references.md).

LLMT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# What building llmtrain and training the quickstart need (scripts/quickstart.sh).
LLMT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libopenmpi-dev openmpi-bin libhdf5-dev
  libtomlplusplus-dev libcli11-dev libsentencepiece-dev
  libopenblas-openmp-dev libdnnl-dev libxxhash-dev fortunes
)
# What the tests add (scripts/test.sh): GoogleTest, h5dump, the spm_train CLI, the Python
# readers and the independent PyTorch model the tests compare against, and a one-node Slurm.
LLMT_TEST_PACKAGES=(
  libgtest-dev hdf5-tools sentencepiece
  python3-torch python3-numpy python3-h5py python3-sentencepiece
  slurm-wlm munge
)

llmt_sudo() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the Debian packages (skipped when all are present): LLMT_PACKAGES, plus
# LLMT_TEST_PACKAGES with the argument "test".
llmt_install_deps() {
  local missing=() wanted=("${LLMT_PACKAGES[@]}")
  if [ "${1:-}" = test ]; then wanted+=("${LLMT_TEST_PACKAGES[@]}"); fi
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    llmt_sudo apt-get update -q
    llmt_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Configures and builds into $1 with extra CMake args after it; LLMT_TARGETS (space-separated)
# limits the build to those targets. ccache sees paths relative to the checkout (CCACHE_BASEDIR)
# and ignores the working directory (CCACHE_NOHASHDIR: debug info may then name the folder of the
# build that filled the cache), so a fresh clone in another folder reuses what an earlier build
# of the same sources compiled.
llmt_build() {
  local dir="$1"
  shift
  export CCACHE_BASEDIR="$LLMT_ROOT" CCACHE_NOHASHDIR=1
  cmake -S "$LLMT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
  # shellcheck disable=SC2086
  cmake --build "$dir" -j "$(nproc)" ${LLMT_TARGETS:+--target $LLMT_TARGETS}
}

# The CUDA compiler, if the toolkit is installed (on PATH or in /usr/local/cuda).
llmt_nvcc() {
  if command -v nvcc >/dev/null 2>&1; then command -v nvcc
  elif [ -x /usr/local/cuda/bin/nvcc ]; then echo /usr/local/cuda/bin/nvcc
  fi
}

# mpirun with what Open MPI needs here: permission to run as root (containers, CI) and more
# ranks than cores (--oversubscribe).
llmt_mpirun() {
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  mpirun --oversubscribe "$@"
}
