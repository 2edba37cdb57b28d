#include "common/process_stats.h"

#include <dlfcn.h>
#include <sys/resource.h>

namespace pserver {

std::string_view AllocatorName() {
  // Each exports an entry point glibc's malloc does not have.
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  return "glibc";
}

uint64_t MinorPageFaults() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<uint64_t>(u.ru_minflt);
}

}  // namespace pserver
