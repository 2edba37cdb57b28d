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
#include <vector>


#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/diagnostics.h"

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
  // The step's diagnostics inputs and what TrainingDiagnostics made of
  // them (worker/diagnostics.h): gauges, time counters, findings by kind.
  void ObserveDiagnostics(const StepSample& s, const TrainingDiagnostics& d,
                          const std::vector<Finding>& found);

 private:
  std::unique_ptr<prometheus::Registry> own_registry_;  // Unexported() only
  prometheus::Gauge& step_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& test_accuracy_;
  prometheus::Gauge& test_loss_;
  prometheus::Histogram& step_seconds_;
  prometheus::Gauge& residual_norm_;
  prometheus::Gauge& gradient_norm_;
  prometheus::Gauge& residual_ratio_;
  prometheus::Counter& compute_seconds_;
  prometheus::Counter& communication_seconds_;
  prometheus::Gauge& communication_share_;
  prometheus::Gauge& push_throughput_;
  prometheus::Family<prometheus::Counter>& diagnostics_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_METRICS_H_
