#include "worker/metrics.h"

#include <utility>

namespace pserver {
namespace {

using prometheus::BuildGauge;
using prometheus::BuildHistogram;

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
                         .Add({})) {
  BuildGauge()
      .Name("pserver_build_info")
      .Help("Always 1; labels name the build.")
      .Register(r)
      .Add({{"version", "0.1.0"}, {"component", "worker"}})
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

void WorkerMetrics::SetTestAccuracy(double accuracy, double loss) {
  test_accuracy_.Set(accuracy);
  test_loss_.Set(loss);
}

}  // namespace pserver
