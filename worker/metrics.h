// Prometheus metrics of one worker daemon (families built once on the
// injected registry). No worker-id label: Prometheus' `instance` target
// label tells workers apart.
#ifndef PSERVER_WORKER_METRICS_H_
#define PSERVER_WORKER_METRICS_H_

#include <cstdint>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/client.h"

namespace pserver {

// Thread-compatible: one training loop updates it; scrapes read atomics.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void ObserveStep(double seconds, uint64_t step, double loss);
  // Adds what changed in `stats` since the last call.
  void Update(const ClientStats& stats, double residual_norm);
  void SetTestAccuracy(double accuracy, double loss);

 private:
  prometheus::Gauge& step_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& test_accuracy_;
  prometheus::Gauge& test_loss_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& encode_seconds_;
  prometheus::Counter& push_bytes_;
  prometheus::Counter& pull_bytes_;
  prometheus::Counter& push_fp32_bytes_;
  prometheus::Counter& pull_fp32_bytes_;
  prometheus::Counter& retries_;
  prometheus::Counter& snapshots_;
  prometheus::Gauge& residual_norm_;
  ClientStats last_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_METRICS_H_
