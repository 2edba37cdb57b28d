#include "worker/metrics.h"

namespace pserver {
namespace {

using prometheus::BuildCounter;
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
      encode_seconds_(BuildCounter()
                          .Name("pserver_worker_encode_seconds_total")
                          .Help("Time spent encoding pushes.")
                          .Register(r)
                          .Add({})),
      push_bytes_(BuildCounter()
                      .Name("pserver_worker_payload_bytes_total")
                      .Help("Encoded payload bytes, by direction.")
                      .Register(r)
                      .Add({{"direction", "push"}})),
      pull_bytes_(BuildCounter()
                      .Name("pserver_worker_payload_bytes_total")
                      .Help("Encoded payload bytes, by direction.")
                      .Register(r)
                      .Add({{"direction", "pull"}})),
      push_fp32_bytes_(BuildCounter()
                           .Name("pserver_worker_fp32_equivalent_bytes_total")
                           .Help("Bytes fp32 would have moved, by direction.")
                           .Register(r)
                           .Add({{"direction", "push"}})),
      pull_fp32_bytes_(BuildCounter()
                           .Name("pserver_worker_fp32_equivalent_bytes_total")
                           .Help("Bytes fp32 would have moved, by direction.")
                           .Register(r)
                           .Add({{"direction", "pull"}})),
      retries_(BuildCounter()
                   .Name("pserver_worker_rpc_retries_total")
                   .Help("RPC attempts retried after UNAVAILABLE or a "
                         "deadline.")
                   .Register(r)
                   .Add({})),
      snapshots_(BuildCounter()
                     .Name("pserver_worker_snapshots_total")
                     .Help("Pulls answered with a full snapshot.")
                     .Register(r)
                     .Add({})),
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

void WorkerMetrics::ObserveStep(double seconds, uint64_t step, double loss) {
  step_seconds_.Observe(seconds);
  step_.Set(static_cast<double>(step));
  loss_.Set(loss);
}

void WorkerMetrics::Update(const ClientStats& s, double residual_norm) {
  auto add = [](prometheus::Counter& c, double now, double before) {
    if (now > before) c.Increment(now - before);
  };
  add(encode_seconds_, s.encode_seconds, last_.encode_seconds);
  add(push_bytes_, s.push_payload_bytes, last_.push_payload_bytes);
  add(pull_bytes_, s.pull_payload_bytes, last_.pull_payload_bytes);
  add(push_fp32_bytes_, s.push_fp32_bytes, last_.push_fp32_bytes);
  add(pull_fp32_bytes_, s.pull_fp32_bytes, last_.pull_fp32_bytes);
  add(retries_, s.retries, last_.retries);
  add(snapshots_, s.snapshots, last_.snapshots);
  residual_norm_.Set(residual_norm);
  last_ = s;
}

void WorkerMetrics::SetTestAccuracy(double accuracy, double loss) {
  test_accuracy_.Set(accuracy);
  test_loss_.Set(loss);
}

}  // namespace pserver
