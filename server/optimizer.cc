#include "server/optimizer.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace pserver {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  if (n == "onebit_adam") return OptimizerKind::kOneBitAdam;
  if (n == "adam") return OptimizerKind::kAdam;
  if (n == "sgd") return OptimizerKind::kSgd;
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer is '", name, "'; expected onebit_adam, adam or sgd"));
}

std::string OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kOneBitAdam: return "onebit_adam";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSgd: return "sgd";
  }
  return "unknown";
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  auto bad = [](absl::string_view field, double value,
                absl::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", value, "; expected ", expected));
  };
  if (!(c.lr >= 0 && std::isfinite(c.lr))) return bad("lr", c.lr, ">= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return bad("beta1", c.beta1, "[0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return bad("beta2", c.beta2, "[0, 1)");
  if (!(c.eps > 0 && std::isfinite(c.eps))) return bad("eps", c.eps, "> 0");
  if (!(c.weight_decay >= 0 && std::isfinite(c.weight_decay))) {
    return bad("weight_decay", c.weight_decay, ">= 0");
  }
  if (!(c.momentum >= 0 && c.momentum < 1)) {
    return bad("momentum", c.momentum, "[0, 1)");
  }
  if (c.kind == OptimizerKind::kOneBitAdam && c.freeze_step < 1) {
    return bad("freeze_step", 0, ">= 1");
  }
  if (!(c.variance_floor >= 0 && c.variance_floor <= 1)) {
    return bad("variance_floor", c.variance_floor, "[0, 1]");
  }
  return absl::OkStatus();
}

void ParallelChunks(uint64_t n,
                    const std::function<void(uint64_t, uint64_t)>& fn) {
  // Below this a second thread costs more than it saves (~20 us to start).
  constexpr uint64_t kMinParallel = uint64_t{1} << 17;
  unsigned threads = std::min(2u, std::max(1u, std::thread::hardware_concurrency()));
  if (n < kMinParallel || threads < 2) {
    fn(0, n);
    return;
  }
  uint64_t mid = (n / 2 + 63) / 64 * 64;
  std::thread other([&] { fn(mid, n); });
  fn(0, mid);
  other.join();
}

Optimizer::Optimizer(const OptimizerConfig& config, uint64_t n,
                     std::vector<LocalSegment> segments)
    : config_(config),
      n_(n),
      segments_(std::move(segments)),
      m_(n, 0.0f),
      freeze_at_(config.freeze_step) {
  if (config_.kind != OptimizerKind::kSgd) v_.assign(n, 0.0f);
}

v1::OptimizerStage Optimizer::stage() const {
  return frozen_ ? v1::OPTIMIZER_STAGE_COMPRESSION : v1::OPTIMIZER_STAGE_WARMUP;
}

v1::GradientSpace Optimizer::expected_space() const {
  return frozen_ && config_.preconditioned ? v1::GRADIENT_SPACE_PRECONDITIONED
                                           : v1::GRADIENT_SPACE_RAW;
}

double Optimizer::Step(absl::Span<const float> g, absl::Span<float> x) {
  double sq[2] = {0, 0};
  ParallelChunks(n_, [&](uint64_t b, uint64_t e) {
    sq[b == 0 ? 0 : 1] = StepRange(b, e, g, x);
  });
  ++step_;
  ++rounds_run_;
  if (config_.kind == OptimizerKind::kOneBitAdam && !frozen_ &&
      step_ >= freeze_at_) {
    Freeze();
  }
  return std::sqrt(sq[0] + sq[1]);
}

double Optimizer::StepRange(uint64_t begin, uint64_t end,
                            absl::Span<const float> g, absl::Span<float> x) {
  const float lr = config_.lr, b1 = config_.beta1, b2 = config_.beta2;
  const float eps = config_.eps, wd = config_.weight_decay;
  float* m = m_.data();
  double sq = 0;
  if (config_.kind == OptimizerKind::kSgd) {
    const float mu = config_.momentum;
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
  if (config_.preconditioned) {
    for (uint64_t i = begin; i < end; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      float d = lr * (m[i] + wd * x[i]);
      x[i] -= d;
      sq += double{d} * d;
    }
  } else {
    for (uint64_t i = begin; i < end; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      float d = lr * (m[i] / (std::sqrt(v[i]) + eps) + wd * x[i]);
      x[i] -= d;
      sq += double{d} * d;
    }
  }
  return sq;
}

void Optimizer::Freeze() {
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

void Optimizer::RestoreState(uint64_t step, bool frozen, std::vector<float> m,
                             std::vector<float> v) {
  step_ = step;
  rounds_run_ = step;
  frozen_ = frozen;
  m_ = std::move(m);
  v_ = std::move(v);
}

void Optimizer::FastForward(uint64_t step) {
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
