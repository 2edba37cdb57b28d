// What a worker watches in its own training loop, step by step, to tell its
// operator when compression hurts training or the network is the
// bottleneck (issue 13 part 4):
//   - instability: a non-finite loss; a loss spike (the recent loss far above
//     the best it has been); the error-feedback residual growing without
//     bound relative to the gradient (a codec that drops more than error
//     feedback can carry);
//   - a communication bottleneck: push and pull take most of the step while
//     compute waits, with the push bandwidth actually reached.
// Each condition is reported once per occurrence (when it starts; it is
// re-armed when it has clearly ended) as a line with a recommendation, and
// counted; the gauges behind them are exported (worker/metrics.h), and the
// Prometheus rules in deploy/prometheus/alerts.yml alert on the same.
//
// Pure arithmetic on what the caller measured: no clock, no I/O, so tests
// feed it scripted series.
#ifndef PSERVER_WORKER_DIAGNOSTICS_H_
#define PSERVER_WORKER_DIAGNOSTICS_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace pserver {

struct DiagnosticsOptions {
  // Steps before the loss-spike and bottleneck checks start (the loss falls
  // fast at first; the first steps pay for connections).
  int64_t warmup_steps = 50;
  // A spike: the recent loss (EMA) above spike_ratio x the lowest recent
  // loss seen, and above it by at least spike_min_nats.
  double spike_ratio = 2.0;
  double spike_min_nats = 0.3;
  // Residual growth: ||e|| / ||g|| (both as EMAs) above residual_ratio and
  // at least residual_growth x what it was residual_window steps before.
  double residual_ratio = 20.0;
  double residual_growth = 2.0;
  int64_t residual_window = 200;
  // A bottleneck: push + pull over the whole step above comm_share (as an
  // EMA); re-armed below comm_share_clear.
  double comm_share = 0.5;
  double comm_share_clear = 0.3;
  // EMA weight of the newest step.
  double ema_alpha = 0.05;
};

// One step as the worker measured it.
struct StepSample {
  int64_t step = 0;
  double loss = 0;
  double gradient_norm = 0;   // ||g|| of the pushed gradient (0: unknown)
  double residual_norm = -1;  // ||e|| of the push residuals (< 0: unknown)
  double compute_seconds = 0;
  double communication_seconds = 0;  // the rest of the step: push, pull
  uint64_t pushed_bytes = 0;
};

enum class DiagnosticKind {
  kNonFiniteLoss,
  kLossSpike,
  kResidualGrowth,
  kCommunicationBottleneck,
};
// "nonfinite_loss", "loss_spike", ... (the metrics' `kind` label).
const char* DiagnosticName(DiagnosticKind kind);

struct Finding {
  DiagnosticKind kind;
  std::string message;  // one line, with the recommendation
};

// Thread-compatible: one training loop feeds it.
class TrainingDiagnostics {
 public:
  explicit TrainingDiagnostics(const DiagnosticsOptions& options = {});

  // Takes one step; returns the conditions that started with it.
  std::vector<Finding> Observe(const StepSample& s);

  // The smoothed figures behind the checks (exported as gauges).
  double communication_share() const { return comm_share_; }
  // Bytes pushed per second of communication time (EMA; 0 until known).
  double push_bytes_per_second() const { return push_bps_; }
  // ||e|| / ||g|| (EMA of each; 0 until known).
  double residual_ratio() const;

 private:
  const DiagnosticsOptions o_;
  int64_t seen_ = 0;
  // Loss.
  double loss_ema_ = 0;
  double best_loss_ema_ = 0;
  bool spiking_ = false;
  bool nonfinite_ = false;
  // Residual.
  double grad_ema_ = 0;
  double residual_ema_ = 0;
  std::deque<double> ratio_history_;  // one per step, the last window + 1
  bool residual_growing_ = false;
  // Communication.
  double comm_share_ = 0;
  double push_bps_ = 0;
  bool bottleneck_ = false;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_DIAGNOSTICS_H_
