// Run-time CPU dispatch: hot kernels are compiled for AVX2+FMA (with BMI1
// and POPCNT) with function target attributes and used only when the CPU
// has them, so binaries stay portable x86-64 (no -march=native).
#ifndef PSERVER_COMMON_INTERNAL_CPU_H_
#define PSERVER_COMMON_INTERNAL_CPU_H_

// PSERVER_CLONES_AVX2 before a function: the compiler builds it twice, for
// AVX2 and for the baseline, and the loader picks one for the CPU (GCC's and
// Clang's target_clones, an ifunc). For plain loops the compiler vectorizes
// (no intrinsics); AVX2 alone has no FMA, so both clones give the same bits.
// Empty off x86-64 and under the sanitizers: an ifunc resolver runs while
// relocations are processed, before a sanitizer's runtime is up
// (ThreadSanitizer crashes in it), so those builds take the baseline.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) || \
    __has_feature(memory_sanitizer)
#define PSERVER_INTERNAL_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define PSERVER_INTERNAL_SANITIZED 1
#endif
#if defined(__x86_64__) && !defined(PSERVER_INTERNAL_SANITIZED)
#define PSERVER_CLONES_AVX2 __attribute__((target_clones("avx2", "default")))
#else
#define PSERVER_CLONES_AVX2
#endif

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
