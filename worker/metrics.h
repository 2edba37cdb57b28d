// Prometheus metrics of one worker daemon's training loop: step, loss, test
// accuracy, step time, residual norm (families built once on the injected
// registry). The client's own counters (bytes, retries, snapshots, rejoins)
// are counted where they happen, by worker/client_metrics.h on the same
// registry. No worker-id label: Prometheus' `instance` target label tells
// workers apart.
#ifndef PSERVER_WORKER_METRICS_H_
#define PSERVER_WORKER_METRICS_H_

#include <cstdint>
#include <memory>


#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pserver {

// Thread-compatible: one training loop updates it; scrapes read atomics.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);
  // Gauges that nobody exports (the no-op sink), for callers without a
  // registry.
  static std::unique_ptr<WorkerMetrics> Unexported();

  void ObserveStep(double seconds, uint64_t step, double loss);
  void SetResidualNorm(double norm) { residual_norm_.Set(norm); }
  void SetTestAccuracy(double accuracy, double loss);

 private:
  std::unique_ptr<prometheus::Registry> own_registry_;  // Unexported() only
  prometheus::Gauge& step_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& test_accuracy_;
  prometheus::Gauge& test_loss_;
  prometheus::Histogram& step_seconds_;
  prometheus::Gauge& residual_norm_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_METRICS_H_
