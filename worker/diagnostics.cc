#include "worker/diagnostics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace pserver {

const char* DiagnosticName(DiagnosticKind kind) {
  switch (kind) {
    case DiagnosticKind::kNonFiniteLoss:
      return "nonfinite_loss";
    case DiagnosticKind::kLossSpike:
      return "loss_spike";
    case DiagnosticKind::kResidualGrowth:
      return "residual_growth";
    case DiagnosticKind::kCommunicationBottleneck:
      return "communication_bottleneck";
  }
  return "unknown";
}

TrainingDiagnostics::TrainingDiagnostics(const DiagnosticsOptions& options)
    : o_(options) {}

double TrainingDiagnostics::residual_ratio() const {
  return grad_ema_ > 0 ? residual_ema_ / grad_ema_ : 0.0;
}

std::vector<Finding> TrainingDiagnostics::Observe(const StepSample& s) {
  std::vector<Finding> found;
  const double a = o_.ema_alpha;
  auto ema = [&](double* v, double x) {
    *v = seen_ == 0 ? x : (1 - a) * *v + a * x;
  };

  // Instability: the loss.
  if (!std::isfinite(s.loss)) {
    if (!nonfinite_) {
      nonfinite_ = true;
      found.push_back(
          {DiagnosticKind::kNonFiniteLoss,
           absl::StrFormat(
               "diagnostic: instability at step %d: the loss is %f; training "
               "diverged. Lower the learning rate, use a less lossy codec "
               "(e.g. 8-bit quantize) or a longer warmup before the freeze",
               s.step, s.loss)});
    }
  } else {
    nonfinite_ = false;
    ema(&loss_ema_, s.loss);
    // The best recent loss: the lowest EMA seen (a plateau or a slow rise
    // after it is not a spike; a jump of spike_ratio x is).
    best_loss_ema_ = seen_ == 0 ? loss_ema_ : std::min(best_loss_ema_, loss_ema_);
    const bool spike = seen_ >= o_.warmup_steps &&
                       loss_ema_ > o_.spike_ratio * best_loss_ema_ &&
                       loss_ema_ - best_loss_ema_ > o_.spike_min_nats;
    if (spike && !spiking_) {
      found.push_back(
          {DiagnosticKind::kLossSpike,
           absl::StrFormat(
               "diagnostic: instability at step %d: the loss (recent mean "
               "%.3f) is %.1fx its best (%.3f). If it follows a codec change "
               "or the freeze, use a gentler schedule or more warmup; "
               "otherwise lower the learning rate",
               s.step, loss_ema_, loss_ema_ / best_loss_ema_, best_loss_ema_)});
    }
    // Re-armed once the loss is back near its best.
    if (spike) {
      spiking_ = true;
    } else if (loss_ema_ < 0.5 * (1 + o_.spike_ratio) * best_loss_ema_) {
      spiking_ = false;
    }
  }

  // Instability: the error-feedback residual against the gradient.
  if (s.residual_norm >= 0 && s.gradient_norm > 0 &&
      std::isfinite(s.gradient_norm) && std::isfinite(s.residual_norm)) {
    ema(&grad_ema_, s.gradient_norm);
    ema(&residual_ema_, s.residual_norm);
    const double ratio = residual_ratio();
    ratio_history_.push_back(ratio);
    while (static_cast<int64_t>(ratio_history_.size()) >
           o_.residual_window + 1) {
      ratio_history_.pop_front();
    }
    const bool full =
        static_cast<int64_t>(ratio_history_.size()) == o_.residual_window + 1;
    const double before = ratio_history_.front();
    const bool growing = full && ratio > o_.residual_ratio &&
                         ratio > o_.residual_growth * before;
    if (growing && !residual_growing_) {
      found.push_back(
          {DiagnosticKind::kResidualGrowth,
           absl::StrFormat(
               "diagnostic: instability at step %d: the error-feedback "
               "residual is %.1fx the gradient and grew %.1fx in the last %d "
               "steps: the codec drops more than error feedback can carry. "
               "Keep more (a larger --k_fraction, more bits) or use a "
               "schedule that compresses less now",
               s.step, ratio, before > 0 ? ratio / before : 0.0,
               o_.residual_window)});
    }
    if (growing) {
      residual_growing_ = true;
    } else if (ratio < o_.residual_ratio) {
      residual_growing_ = false;
    }
  }

  // Communication against compute.
  const double total = s.compute_seconds + s.communication_seconds;
  if (total > 0) {
    ema(&comm_share_, s.communication_seconds / total);
    if (s.communication_seconds > 0) {
      ema(&push_bps_, static_cast<double>(s.pushed_bytes) /
                          s.communication_seconds);
    }
    const bool bound =
        seen_ >= o_.warmup_steps && comm_share_ > o_.comm_share;
    if (bound && !bottleneck_) {
      found.push_back(
          {DiagnosticKind::kCommunicationBottleneck,
           absl::StrFormat(
               "diagnostic: communication-bound at step %d: pushes, pulls "
               "and waiting for the round take %.0f%% of the step, compute "
               "%.0f%% (pushes reach %.1f MB/s). If the link is slow, "
               "compress more (--push_codec onebit or topk, or a schedule) "
               "or push less often (--local_steps); if other workers are "
               "slower, see the shards' straggler diagnostic",
               s.step, 100 * comm_share_, 100 * (1 - comm_share_),
               push_bps_ / 1e6)});
    }
    if (bound) {
      bottleneck_ = true;
    } else if (comm_share_ < o_.comm_share_clear) {
      bottleneck_ = false;
    }
  }
  ++seen_;
  return found;
}

}  // namespace pserver
