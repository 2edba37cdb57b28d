#include "common/process_stats.h"

#include <dlfcn.h>
#include <sys/resource.h>

namespace pserver {

std::string_view AllocatorName() {
  // Told by the entry points each allocator adds to the process. pserver
  // never links jemalloc, so one present was preloaded, and a preloaded
  // malloc wins over a linked tcmalloc. (Resolving "malloc" itself does not
  // tell: in a non-PIE executable such as CPython it names the executable's
  // own PLT entry.)
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  return "glibc";
}

ProcessUsage ReadProcessUsage() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return ProcessUsage();
  ProcessUsage out;
  out.cpu_seconds =
      static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
      static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
  out.minor_faults = static_cast<uint64_t>(u.ru_minflt);
  out.peak_resident_bytes = static_cast<uint64_t>(u.ru_maxrss) * 1024;  // KiB
  return out;
}

}  // namespace pserver
