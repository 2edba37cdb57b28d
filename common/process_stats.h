// What a process can say about its own behaviour: which malloc it runs on,
// and its CPU seconds and minor page faults so far. The benchmarks print
// the faults beside step times: a step that hands its buffers back to the
// kernel and faults them in again costs several times a step that keeps
// them, and which one a machine gets depends on the allocator.
#ifndef PSERVER_COMMON_PROCESS_STATS_H_
#define PSERVER_COMMON_PROCESS_STATS_H_

#include <cstdint>
#include <string_view>

namespace pserver {

// The allocator malloc resolves to in this process, found at run time (so a
// preloaded one is named too): "tcmalloc", "jemalloc" or "glibc".
std::string_view AllocatorName();

// The whole process so far, from one getrusage call (all zero if it
// fails): user + system CPU seconds, minor page faults (ru_minflt) and the
// peak resident memory (ru_maxrss).
struct ProcessUsage {
  double cpu_seconds = 0;
  uint64_t minor_faults = 0;
  uint64_t peak_resident_bytes = 0;
};
ProcessUsage ReadProcessUsage();

}  // namespace pserver

#endif  // PSERVER_COMMON_PROCESS_STATS_H_
