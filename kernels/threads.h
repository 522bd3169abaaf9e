// Thread count of the CPU backend: OpenMP kernels and the BLAS library use the same number, so
// the two pools never oversubscribe the cores of a rank.
#pragma once

namespace llmt {

// n <= 0 means all available cores. Returns the count in effect.
int set_cpu_threads(int n);
int cpu_threads();

}  // namespace llmt
