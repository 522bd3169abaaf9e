// Sets OpenMP's and OpenBLAS's thread counts together (see kernels/threads.h).
#include "kernels/threads.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace llmt {

namespace {
int positive_env(const char* name) {
  const char* v = std::getenv(name);
  const int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 0;
}
}  // namespace

ThreadChoice default_cpu_threads(int local_ranks) {
  if (int n = positive_env("OMP_NUM_THREADS")) return {n, "OMP_NUM_THREADS"};
  if (int n = positive_env("SLURM_CPUS_PER_TASK")) return {n, "SLURM_CPUS_PER_TASK"};
  const int mask = omp_get_num_procs();  // the CPUs of this process's affinity mask
  const long node = sysconf(_SC_NPROCESSORS_ONLN);
  if (local_ranks > 1 && mask >= node) {
    const int n = std::max(1, mask / local_ranks);
    return {n, std::to_string(mask) + " CPUs of the node / " + std::to_string(local_ranks) +
                   " unbound ranks"};
  }
  return {mask, "affinity mask: " + std::to_string(mask) + (mask == 1 ? " CPU" : " CPUs")};
}

int set_cpu_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return n;
}

int cpu_threads() {
  return omp_get_max_threads();
}

}  // namespace llmt
