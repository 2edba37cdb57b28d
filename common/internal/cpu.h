// Run-time CPU dispatch: hot kernels are compiled for AVX2+FMA (with BMI1
// and POPCNT) with function target attributes and used only when the CPU
// has them, so binaries stay portable x86-64 (no -march=native).
#ifndef PSERVER_COMMON_INTERNAL_CPU_H_
#define PSERVER_COMMON_INTERNAL_CPU_H_

namespace pserver {
namespace internal {

// True if AVX2 kernels may run: the CPU has AVX2, FMA, BMI1 and POPCNT and
// the scalar path is not forced. Thread-safe.
bool UseAvx2();

// For tests and benchmarks only: forces the portable scalar kernels, which
// must give bit-identical results. Thread-safe (atomic), process-wide.
void ForceScalarKernelsForTesting(bool force);

}  // namespace internal
}  // namespace pserver

#endif  // PSERVER_COMMON_INTERNAL_CPU_H_
