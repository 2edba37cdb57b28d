#include "server/moment_optimizer.h"

#include <algorithm>
#include <cmath>

namespace pserver {

MomentOptimizer::MomentOptimizer(const OptimizerConfig& config, uint64_t n,
                                 std::vector<LocalSegment> segments,
                                 ThreadPool* pool)
    : config_(config),
      pool_(pool != nullptr ? pool : ThreadPool::Default()),
      n_(n),
      segments_(std::move(segments)),
      m_(n, 0.0f),
      freeze_at_(config.freeze_step) {
  if (config_.kind != OptimizerKind::kSgd) v_.assign(n, 0.0f);
  if (segments_.empty() && n > 0) segments_.push_back({0, n});
}

v1::OptimizerStage MomentOptimizer::stage() const {
  return frozen_ ? v1::OPTIMIZER_STAGE_COMPRESSION : v1::OPTIMIZER_STAGE_WARMUP;
}

v1::GradientSpace MomentOptimizer::expected_space() const {
  return frozen_ && config_.preconditioned ? v1::GRADIENT_SPACE_PRECONDITIONED
                                           : v1::GRADIENT_SPACE_RAW;
}

double MomentOptimizer::Step(absl::Span<const float> g, absl::Span<float> x) {
  // One partial sum per chunk (at most helpers + 1), added in chunk order.
  std::vector<double> sq(static_cast<size_t>(pool_->helpers()) + 1, 0.0);
  const uint64_t chunk = std::max<uint64_t>(1, n_ / sq.size());
  const float grow = GrowthScale();  // once per step, for every chunk
  pool_->ParallelFor(n_, kMinParallelChunk, [&](uint64_t b, uint64_t e) {
    sq[std::min<uint64_t>(b / chunk, sq.size() - 1)] =
        StepSegments(b, e, g, x, grow);
  });
  double total = 0;
  for (double s : sq) total += s;
  ++step_;
  ++rounds_run_;
  if (config_.kind == OptimizerKind::kOneBitAdam && !frozen_ &&
      step_ >= freeze_at_) {
    Freeze();
  }
  return std::sqrt(total);
}

double MomentOptimizer::StepSegments(uint64_t begin, uint64_t end,
                                     absl::Span<const float> g,
                                     absl::Span<float> x, float grow) {
  const GroupHyper fallback{config_.lr, config_.weight_decay};
  // The first segment that ends after `begin`.
  auto it = std::upper_bound(
      segments_.begin(), segments_.end(), begin,
      [](uint64_t at, const LocalSegment& s) { return at < s.end; });
  double sq = 0;
  uint64_t at = begin;
  for (; it != segments_.end() && at < end; ++it) {
    const uint64_t b = std::max(at, it->begin);
    const uint64_t e = std::min(end, it->end);
    if (b >= e) continue;
    if (it->buffer) {
      // Not an update: left out of the norm (the update-norm gauge and the
      // blow-up diagnostics are about the parameters).
      std::copy(g.begin() + b, g.begin() + e, x.begin() + b);
    } else {
      const GroupHyper& h =
          it->group < hyper_.size() ? hyper_[it->group] : fallback;
      sq += StepRange(b, e, g, x, grow, h);
    }
    at = e;
  }
  return sq;
}

double MomentOptimizer::StepRange(uint64_t begin, uint64_t end,
                            absl::Span<const float> g, absl::Span<float> x,
                            float grow, const GroupHyper& h) {
  const float lr = h.lr, b1 = config_.beta1, b2 = config_.beta2;
  const float eps = config_.eps, wd = h.weight_decay;
  float* m = m_.data();
  double sq = 0;
  if (config_.kind == OptimizerKind::kSgd) {
    const float mu = config_.momentum;
    if (config_.nesterov) {
      for (uint64_t i = begin; i < end; ++i) {
        float gi = g[i] + wd * x[i];
        m[i] = mu * m[i] + gi;
        float d = lr * (gi + mu * m[i]);
        x[i] -= d;
        sq += double{d} * d;
      }
      return sq;
    }
    for (uint64_t i = begin; i < end; ++i) {
      float gi = g[i] + wd * x[i];
      m[i] = mu * m[i] + gi;
      float d = lr * m[i];
      x[i] -= d;
      sq += double{d} * d;
    }
    return sq;
  }
  float* v = v_.data();
  if (!frozen_) {
    float mc = 1.0f, vc = 1.0f;
    if (config_.bias_correction) {
      double t = static_cast<double>(step_ + 1);
      mc = static_cast<float>(1.0 / (1.0 - std::pow(double{b1}, t)));
      vc = static_cast<float>(1.0 / (1.0 - std::pow(double{b2}, t)));
    }
    for (uint64_t i = begin; i < end; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      float update = (m[i] * mc) / (std::sqrt(v[i] * vc) + eps);
      float d = lr * (update + wd * x[i]);
      x[i] -= d;
      sq += double{d} * d;
    }
    return sq;
  }
  const float c1 = CompressionBeta1(config_);
  if (config_.worker_momentum) {
    // g is the mean of the workers' momenta since the freeze; m carries the
    // momentum the freeze found, decaying as if no gradient followed.
    for (uint64_t i = begin; i < end; ++i) {
      m[i] = c1 * m[i];
      float mom = m[i] + g[i];
      float d = config_.preconditioned
                    ? lr * (grow * mom + wd * x[i])
                    : lr * (grow * mom / (std::sqrt(v[i]) + eps) + wd * x[i]);
      x[i] -= d;
      sq += double{d} * d;
    }
    return sq;
  }
  if (config_.preconditioned) {
    for (uint64_t i = begin; i < end; ++i) {
      m[i] = c1 * m[i] + (1.0f - c1) * g[i];
      float d = lr * (grow * m[i] + wd * x[i]);
      x[i] -= d;
      sq += double{d} * d;
    }
  } else {
    for (uint64_t i = begin; i < end; ++i) {
      m[i] = c1 * m[i] + (1.0f - c1) * g[i];
      float d = lr * (grow * m[i] / (std::sqrt(v[i]) + eps) + wd * x[i]);
      x[i] -= d;
      sq += double{d} * d;
    }
  }
  return sq;
}

float MomentOptimizer::GrowthScale() const {
  if (!config_.variance_growth || config_.bias_correction || !frozen_ ||
      freeze_at_ == 0) {
    return 1.0f;
  }
  // This step is round step_ + 1; v froze after round freeze_at_.
  const double b2 = config_.beta2;
  const double t = static_cast<double>(std::max(step_ + 1, freeze_at_));
  const double frozen = 1.0 - std::pow(b2, static_cast<double>(freeze_at_));
  const double now = 1.0 - std::pow(b2, t);
  return now > 0 ? static_cast<float>(std::sqrt(frozen / now)) : 1.0f;
}

void MomentOptimizer::Freeze() {
  frozen_ = true;
  if (config_.bias_correction && step_ > 0) {
    // Freeze the bias-corrected moments: the compression stage then takes
    // the steps plain Adam (with correction) would take at this point.
    double t = static_cast<double>(step_);
    float mc = static_cast<float>(1.0 / (1.0 - std::pow(double{config_.beta1}, t)));
    float vc = static_cast<float>(1.0 / (1.0 - std::pow(double{config_.beta2}, t)));
    for (uint64_t i = 0; i < n_; ++i) {
      m_[i] *= mc;
      v_[i] *= vc;
    }
  }
  if (!config_.preconditioned) return;  // DeepSpeed-exact: no floor, raw m
  for (const LocalSegment& s : segments_) {
    double sum = 0;
    for (uint64_t i = s.begin; i < s.end; ++i) sum += std::sqrt(double{v_[i]});
    uint64_t len = s.end - s.begin;
    float floor = len ? static_cast<float>(config_.variance_floor * sum / len)
                      : 0.0f;
    for (uint64_t i = s.begin; i < s.end; ++i) {
      float root = std::sqrt(v_[i]);
      if (root < floor) {
        root = floor;
        v_[i] = floor * floor;
      }
      // Momentum into the preconditioned space: m_D = m / (sqrt(v) + eps).
      m_[i] = m_[i] / (root + config_.eps);
    }
  }
}

void MomentOptimizer::RestoreState(uint64_t step, bool frozen, std::vector<float> m,
                             std::vector<float> v, uint64_t freeze_at) {
  step_ = step;
  if (freeze_at > 0) freeze_at_ = freeze_at;
  rounds_run_ = step;
  frozen_ = frozen;
  m_ = std::move(m);
  v_ = std::move(v);
}

void MomentOptimizer::FastForward(uint64_t step) {
  if (step <= step_) return;
  step_ = step;
  if (config_.kind != OptimizerKind::kOneBitAdam || frozen_ ||
      step_ < freeze_at_) {
    return;
  }
  if (rounds_run_ > 0) {
    Freeze();
  } else {
    freeze_at_ = step_ + config_.freeze_step;
  }
}

}  // namespace pserver
