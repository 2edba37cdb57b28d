#include "common/process_stats.h"

#include <dlfcn.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

namespace pserver {

std::string_view AllocatorName() {
  // The library the process's malloc symbol resolves to: a preloaded
  // allocator wins over a linked one, and both over glibc's.
  void* const entry = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (entry != nullptr && dladdr(entry, &info) != 0 &&
      info.dli_fname != nullptr) {
    if (std::strstr(info.dli_fname, "tcmalloc") != nullptr) return "tcmalloc";
    if (std::strstr(info.dli_fname, "jemalloc") != nullptr) return "jemalloc";
    if (std::strstr(info.dli_fname, "libc.so") != nullptr) return "glibc";
  }
  // A non-PIE executable that takes malloc's address (CPython does) makes
  // its own PLT entry the symbol's address, naming the executable. Then
  // tell by the entry points each allocator adds: pserver never links
  // jemalloc, so one present was preloaded and wins over a linked tcmalloc.
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  return "glibc";
}

uint64_t MinorPageFaults() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<uint64_t>(u.ru_minflt);
}

}  // namespace pserver
