// Thread count of the CPU backend: OpenMP kernels and the BLAS library use the same number, so
// the two pools never oversubscribe the cores of a rank.
#pragma once

#include <string>

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

}  // namespace llmt
