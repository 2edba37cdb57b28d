// What a process can say about its own memory behaviour: which malloc it
// runs on, and how many minor page faults it has taken. The benchmarks
// print both beside step times: a step that hands its buffers back to the
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

// Minor page faults of the whole process so far (getrusage's ru_minflt).
uint64_t MinorPageFaults();

// User + system CPU seconds of the whole process so far (getrusage).
double ProcessCpuSeconds();

}  // namespace pserver

#endif  // PSERVER_COMMON_PROCESS_STATS_H_
