// Thread count of the CPU backend: OpenMP kernels and the BLAS library use the same number, so
// the two pools never oversubscribe the cores of a rank.
#pragma once

#include <string>

#include "core/peak_flops.h"

namespace llmt {

// n <= 0 means all available cores. Returns the count in effect.
int set_cpu_threads(int n);
int cpu_threads();

// The thread count train.threads = 0 means for a rank: never more than the CPUs it may run on.
// OMP_NUM_THREADS when set, else SLURM_CPUS_PER_TASK, else the CPUs of its affinity mask, divided
// by `local_ranks` (the ranks of its node) when the mask is the whole node (ranks not bound:
// srun without binding, mpirun --bind-to none). `source` says which, for the start-up line.
struct ThreadChoice {
  int threads = 1;
  std::string source;  // "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "affinity mask (4 CPUs)", ...
};
ThreadChoice default_cpu_threads(int local_ranks);

// FLOP/s of one thread running independent fp32 FMAs at the widest vector width this build
// targets (-march), while `threads` threads run them at once (so all-core clocks count), for
// about `seconds`: the measured half of the CPU peak (core/peak_flops.h, cpu_peak).
double measure_fma_flops_per_thread(int threads, double seconds = 0.03);

// This machine's CPU peak for a rank of `threads` threads (core/peak_flops.h, cpu_peak), the same
// from run to run: the clock is cpufreq's maximum when the kernel exposes it (`cpufreq_max`,
// cpufreq_max_hz()); else LLMTRAIN_CPU_CLOCK_GHZ when set (a clock given); else the one a
// measured FMA loop implies (the best of three), measured once per CPU model and thread count
// and kept in $XDG_CACHE_HOME/llmtrain/cpu-clock.tsv (~/.cache without XDG_CACHE_HOME), which
// later runs read: a measurement on a loaded machine varies by 3x, and MFU and `plan` on the cpu
// profile must not. Delete the file to measure again. Throws on a malformed
// LLMTRAIN_CPU_CLOCK_GHZ.
CpuPeak host_cpu_peak(int threads, double cpufreq_max);

}  // namespace llmt
