#include "common/internal/cpu.h"

#include <atomic>

namespace pserver {
namespace internal {
namespace {

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    // The AVX2 kernels also use BMI1 (tzcnt, blsr) and POPCNT, which every
    // AVX2 CPU has, but a virtual machine may hide them.
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt");
  }();
  return has;
#else
  return false;
#endif
}

// The one piece of process-wide mutable state: a test hook, never set in
// production code.
std::atomic<bool> force_scalar{false};

}  // namespace

bool UseAvx2() {
  return CpuHasAvx2() && !force_scalar.load(std::memory_order_relaxed);
}

void ForceScalarKernelsForTesting(bool force) {
  force_scalar.store(force, std::memory_order_relaxed);
}

}  // namespace internal
}  // namespace pserver
