#include "server/moment_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/internal/cpu.h"

namespace pserver {

namespace moment_kernels {

// The per-element updates, one function per optimizer and stage, over
// restrict pointers and with no dependence between elements, so that the
// compiler vectorizes them (the sums of squares are apart, in Tiled).
// Compiled for AVX2 and for the baseline, chosen at load time
// (PSERVER_CLONES_AVX2); no multiply-add is fused, so both give the bits
// the scalar formulas of optimizer.h give, operation for operation. d[j]
// receives the change to x[j].
#define PSERVER_MOMENT_KERNEL PSERVER_CLONES_AVX2

PSERVER_MOMENT_KERNEL void Sgd(float* __restrict x, float* __restrict m,
                               const float* __restrict g, float* __restrict d,
                               uint64_t n, float lr, float wd, float mu) {
  for (uint64_t i = 0; i < n; ++i) {
    float gi = g[i] + wd * x[i];
    float mi = mu * m[i] + gi;
    m[i] = mi;
    float di = lr * mi;
    x[i] -= di;
    d[i] = di;
  }
}

PSERVER_MOMENT_KERNEL void SgdNesterov(float* __restrict x,
                                       float* __restrict m,
                                       const float* __restrict g,
                                       float* __restrict d, uint64_t n,
                                       float lr, float wd, float mu) {
  for (uint64_t i = 0; i < n; ++i) {
    float gi = g[i] + wd * x[i];
    float mi = mu * m[i] + gi;
    m[i] = mi;
    float di = lr * (gi + mu * mi);
    x[i] -= di;
    d[i] = di;
  }
}

PSERVER_MOMENT_KERNEL void Adam(float* __restrict x, float* __restrict m,
                                float* __restrict v, const float* __restrict g,
                                float* __restrict d, uint64_t n, float lr,
                                float wd, float b1, float b2, float mc,
                                float vc, float eps) {
  for (uint64_t i = 0; i < n; ++i) {
    float mi = b1 * m[i] + (1.0f - b1) * g[i];
    float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    float update = (mi * mc) / (std::sqrt(vi * vc) + eps);
    float di = lr * (update + wd * x[i]);
    x[i] -= di;
    d[i] = di;
  }
}

// 1-bit Adam's compression stage. worker: g is the workers' momentum and m
// only decays; else m follows g. pre: the preconditioned step (v unread,
// may be null); else divided by sqrt(v) + eps. The flags are the same for
// the whole loop, which the compiler unswitches into four vector loops.
PSERVER_MOMENT_KERNEL void CompressionStage(
    float* __restrict x, float* __restrict m, const float* __restrict v,
    const float* __restrict g, float* __restrict d, uint64_t n, float lr,
    float wd, float c1, float grow, float eps, bool worker, bool pre) {
  for (uint64_t i = 0; i < n; ++i) {
    const float mi = worker ? c1 * m[i] : c1 * m[i] + (1.0f - c1) * g[i];
    m[i] = mi;
    const float mom = worker ? mi + g[i] : mi;
    const float di =
        pre ? lr * (grow * mom + wd * x[i])
            : lr * (grow * mom / (std::sqrt(v[i]) + eps) + wd * x[i]);
    x[i] -= di;
    d[i] = di;
  }
}

#undef PSERVER_MOMENT_KERNEL

// Runs step(offset, len, d) over [0, n) in tiles, d receiving the tile's
// changes to x, and returns the sum of their squares: in double, element j
// of a tile into lane j % 8, the lanes added in a fixed tree (the norm is a
// gauge; the order only moves its last bits).
template <typename Step>
double Tiled(uint64_t n, Step step) {
  constexpr uint64_t kTile = 1024;
  alignas(64) float d[kTile];
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (uint64_t o = 0; o < n; o += kTile) {
    const uint64_t len = std::min(kTile, n - o);
    step(o, len, d);
    uint64_t j = 0;
    for (; j + 8 <= len; j += 8) {
      for (int k = 0; k < 8; ++k) {
        acc[k] += static_cast<double>(d[j + k]) * d[j + k];
      }
    }
    for (; j < len; ++j) acc[j % 8] += static_cast<double>(d[j]) * d[j];
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) +
         ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

}  // namespace moment_kernels

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
  if (!skip_.empty()) {
    if (idle_.empty()) idle_.assign(segments_.size(), 0);
    for (size_t i = 0; i < skip_.size() && i < idle_.size(); ++i) {
      idle_[i] += skip_[i] ? 1 : 0;
    }
    skip_.clear();
  }
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
    const size_t i = it - segments_.begin();
    if (i < skip_.size() && skip_[i]) {
      at = e;  // no gradient this round: left as it is
      continue;
    }
    if (it->buffer) {
      // Not an update: left out of the norm (the update-norm gauge and the
      // blow-up diagnostics are about the parameters).
      std::copy(g.begin() + b, g.begin() + e, x.begin() + b);
    } else {
      const GroupHyper& h =
          it->group < hyper_.size() ? hyper_[it->group] : fallback;
      sq += StepRange(b, e, g, x, grow, h, i < idle_.size() ? idle_[i] : 0);
    }
    at = e;
  }
  return sq;
}

double MomentOptimizer::StepRange(uint64_t begin, uint64_t end,
                            absl::Span<const float> g, absl::Span<float> x,
                            float grow, const GroupHyper& h, uint64_t idle) {
  using moment_kernels::Tiled;
  const float lr = h.lr, b1 = config_.beta1, b2 = config_.beta2;
  const float eps = config_.eps, wd = h.weight_decay;
  float* const m = m_.data() + begin;
  float* const xb = x.data() + begin;
  const float* const gb = g.data() + begin;
  const uint64_t n = end - begin;
  if (config_.kind == OptimizerKind::kSgd) {
    const float mu = config_.momentum;
    return config_.nesterov
               ? Tiled(n, [&](uint64_t o, uint64_t len, float* d) {
                   moment_kernels::SgdNesterov(xb + o, m + o, gb + o, d, len,
                                               lr, wd, mu);
                 })
               : Tiled(n, [&](uint64_t o, uint64_t len, float* d) {
                   moment_kernels::Sgd(xb + o, m + o, gb + o, d, len, lr, wd,
                                       mu);
                 });
  }
  float* const v = v_.data() + begin;
  if (!frozen_) {
    float mc = 1.0f, vc = 1.0f;
    Corrections(step_ + 1, idle, &mc, &vc);
    return Tiled(n, [&](uint64_t o, uint64_t len, float* d) {
      moment_kernels::Adam(xb + o, m + o, v + o, gb + o, d, len, lr, wd, b1,
                           b2, mc, vc, eps);
    });
  }
  const float c1 = CompressionBeta1(config_);
  const bool worker = config_.worker_momentum, pre = config_.preconditioned;
  // With worker momentum, g is the mean of the workers' momenta since the
  // freeze; m carries the momentum the freeze found, decaying as if no
  // gradient followed.
  return Tiled(n, [&](uint64_t o, uint64_t len, float* d) {
    moment_kernels::CompressionStage(xb + o, m + o, pre ? nullptr : v + o,
                                     gb + o, d, len, lr, wd, c1, grow, eps,
                                     worker, pre);
  });
}

void MomentOptimizer::Corrections(uint64_t t, uint64_t idle, float* mc,
                                  float* vc) const {
  *mc = *vc = 1.0f;
  if (!config_.bias_correction || t <= idle) return;
  const double own = static_cast<double>(t - idle);
  *mc = static_cast<float>(1.0 / (1.0 - std::pow(double{config_.beta1}, own)));
  *vc = static_cast<float>(1.0 / (1.0 - std::pow(double{config_.beta2}, own)));
}

absl::Status MomentOptimizer::RestoreIdleRounds(std::vector<uint64_t> idle) {
  if (!idle.empty() && idle.size() != segments_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "idle rounds hold ", idle.size(), " entries; expected 0 or ",
        segments_.size(), " (one per tensor of the shard)"));
  }
  for (size_t i = 0; i < idle.size(); ++i) {
    if (idle[i] > step_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "idle rounds[", i, "] is ", idle[i], "; expected at most the step, ",
          step_));
    }
  }
  idle_ = std::move(idle);
  return absl::OkStatus();
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
    // the steps plain Adam (with correction) would take at this point (each
    // tensor at its own step count).
    for (size_t k = 0; k < segments_.size(); ++k) {
      float mc = 1.0f, vc = 1.0f;
      Corrections(step_, k < idle_.size() ? idle_[k] : 0, &mc, &vc);
      for (uint64_t i = segments_[k].begin; i < segments_[k].end; ++i) {
        m_[i] *= mc;
        v_[i] *= vc;
      }
    }
  }
  FillUnseenVariance();
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

void MomentOptimizer::FillUnseenVariance() {
  // A parameter tensor that had no gradient in any round before the freeze
  // (torch's .grad None throughout) has v = 0: once a gradient came, its
  // steps would be m / eps. It takes the mean sqrt(v) of the tensors that
  // had one instead, the closest scale the shard knows.
  double sum = 0;
  uint64_t seen = 0;
  std::vector<size_t> unseen;
  for (size_t k = 0; k < segments_.size(); ++k) {
    const LocalSegment& s = segments_[k];
    if (s.buffer) continue;
    if (k < idle_.size() && idle_[k] >= step_) {
      unseen.push_back(k);
      continue;
    }
    for (uint64_t i = s.begin; i < s.end; ++i) sum += std::sqrt(double{v_[i]});
    seen += s.end - s.begin;
  }
  if (unseen.empty() || seen == 0) return;
  const float root = static_cast<float>(sum / static_cast<double>(seen));
  for (size_t k : unseen) {
    for (uint64_t i = segments_[k].begin; i < segments_[k].end; ++i) {
      v_[i] = root * root;
    }
  }
  std::fprintf(stderr,
               "pserver: 1-bit Adam froze its variance at step %llu with %zu "
               "tensor(s) of this shard that never had a gradient; they take "
               "the others' mean sqrt(v), %g\n",
               static_cast<unsigned long long>(step_), unseen.size(),
               static_cast<double>(root));
}

void MomentOptimizer::RestoreState(uint64_t step, bool frozen, std::vector<float> m,
                             std::vector<float> v, uint64_t freeze_at) {
  step_ = step;
  if (freeze_at > 0) freeze_at_ = freeze_at;
  rounds_run_ = step;
  idle_.clear();
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
