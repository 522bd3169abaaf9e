// Sets OpenMP's and OpenBLAS's thread counts together (see kernels/threads.h).
#include "kernels/threads.h"

#include <cblas.h>
#include <omp.h>

namespace llmt {

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
