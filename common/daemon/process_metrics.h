// The process metrics Prometheus' own client libraries export for every
// process (process_cpu_seconds_total, process_resident_memory_bytes,
// process_start_time_seconds, process_open_fds), which prometheus-cpp does
// not, plus the minor page faults and the peak resident memory: what an
// operator reads to see a daemon's CPU and memory per step, and what the
// benchmarks read from /metrics. Read from getrusage and /proc/self at each
// scrape; nothing is sampled in between.
#ifndef PSERVER_COMMON_DAEMON_PROCESS_METRICS_H_
#define PSERVER_COMMON_DAEMON_PROCESS_METRICS_H_

#include <memory>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace pserver {

class ProcessMetrics : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// The process's one collector, for an exposer to register (it holds a
// weak pointer; this one lives as long as the process).
std::shared_ptr<ProcessMetrics> TheProcessMetrics();

}  // namespace pserver

#endif  // PSERVER_COMMON_DAEMON_PROCESS_METRICS_H_
