#include "worker/metrics.h"

#include <string>
#include <utility>

#include "common/process_stats.h"

namespace pserver {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Gauge& Gauge(prometheus::Registry& r, const char* name,
                         const char* help) {
  return BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Counter& Counter(prometheus::Registry& r, const char* name,
                             const char* help) {
  return BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram::BucketBoundaries StepBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-4; v < 120; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : step_(BuildGauge()
                .Name("pserver_worker_step")
                .Help("Steps completed by this worker.")
                .Register(r)
                .Add({})),
      loss_(BuildGauge()
                .Name("pserver_worker_train_loss")
                .Help("Mean cross-entropy of the last minibatch, nats.")
                .Register(r)
                .Add({})),
      test_accuracy_(BuildGauge()
                         .Name("pserver_worker_test_accuracy_ratio")
                         .Help("Accuracy on the test set at the last "
                               "evaluation, 0..1.")
                         .Register(r)
                         .Add({})),
      test_loss_(BuildGauge()
                     .Name("pserver_worker_test_loss")
                     .Help("Mean cross-entropy on the test set, nats.")
                     .Register(r)
                     .Add({})),
      step_seconds_(BuildHistogram()
                        .Name("pserver_worker_step_duration_seconds")
                        .Help("One training step: compute, push, pull.")
                        .Register(r)
                        .Add({}, StepBuckets())),
      residual_norm_(BuildGauge()
                         .Name("pserver_worker_error_feedback_norm")
                         .Help("L2 norm of the push error-feedback residual.")
                         .Register(r)
                         .Add({})),
      gradient_norm_(Gauge(r, "pserver_worker_gradient_norm",
                           "L2 norm of the last gradient pushed (sampled "
                           "every few steps on large models).")),
      residual_ratio_(Gauge(r, "pserver_worker_error_feedback_ratio",
                            "Error-feedback residual norm over gradient norm "
                            "(moving averages of each).")),
      compute_seconds_(Counter(r, "pserver_worker_compute_seconds_total",
                               "Time in the model's forward and backward "
                               "passes (pushes may overlap it).")),
      communication_seconds_(
          Counter(r, "pserver_worker_communication_seconds_total",
                  "Time of the steps beyond compute: waiting for pushes and "
                  "pulls.")),
      communication_share_(Gauge(r, "pserver_worker_communication_share",
                                 "Moving average of communication time over "
                                 "step time, 0..1.")),
      push_throughput_(Gauge(r, "pserver_worker_push_throughput_bytes_per_second",
                             "Moving average of bytes pushed per second of "
                             "communication time.")),
      diagnostics_(BuildCounter()
                       .Name("pserver_worker_diagnostics_total")
                       .Help("Conditions the worker reported (logged once "
                             "per occurrence), by kind: nonfinite_loss, "
                             "loss_spike, residual_growth, "
                             "communication_bottleneck.")
                       .Register(r)) {
  for (DiagnosticKind k :
       {DiagnosticKind::kNonFiniteLoss, DiagnosticKind::kLossSpike,
        DiagnosticKind::kResidualGrowth,
        DiagnosticKind::kCommunicationBottleneck}) {
    diagnostics_.Add({{"kind", DiagnosticName(k)}});  // 0 until it happens
  }
  BuildGauge()
      .Name("pserver_build_info")
      .Help("Always 1; labels name the build.")
      .Register(r)
      .Add({{"version", "0.1.0"}, {"component", "worker"},
            {"malloc", std::string(AllocatorName())}})
      .Set(1);
}

std::unique_ptr<WorkerMetrics> WorkerMetrics::Unexported() {
  auto registry = std::make_unique<prometheus::Registry>();
  auto m = std::make_unique<WorkerMetrics>(*registry);
  m->own_registry_ = std::move(registry);
  return m;
}

void WorkerMetrics::ObserveStep(double seconds, uint64_t step, double loss) {
  step_seconds_.Observe(seconds);
  step_.Set(static_cast<double>(step));
  loss_.Set(loss);
}

void WorkerMetrics::ObserveDiagnostics(const StepSample& s,
                                       const TrainingDiagnostics& d,
                                       const std::vector<Finding>& found) {
  if (s.gradient_norm > 0) gradient_norm_.Set(s.gradient_norm);
  residual_ratio_.Set(d.residual_ratio());
  compute_seconds_.Increment(s.compute_seconds);
  communication_seconds_.Increment(s.communication_seconds);
  communication_share_.Set(d.communication_share());
  push_throughput_.Set(d.push_bytes_per_second());
  for (const Finding& f : found) {
    diagnostics_.Add({{"kind", DiagnosticName(f.kind)}}).Increment();
  }
}

void WorkerMetrics::SetTestAccuracy(double accuracy, double loss) {
  test_accuracy_.Set(accuracy);
  test_loss_.Set(loss);
}

}  // namespace pserver
