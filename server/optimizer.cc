#include "server/optimizer.h"

#include "server/moment_optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pserver {

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
  if (!(c.compression_beta1 == -1.0f ||
        (c.compression_beta1 >= 0 && c.compression_beta1 < 1))) {
    return bad("compression_beta1", c.compression_beta1,
               "[0, 1), or -1 for beta1");
  }
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
  return ValidateLrSchedule(ScheduleOf(c));
}

absl::Status ApplyLearningRateSchedule(const v1::CompressionSchedule& schedule,
                                       OptimizerConfig* config) {
  if (!schedule.has_learning_rate()) return absl::OkStatus();
  const v1::LearningRateSchedule& lr = schedule.learning_rate();
  LrDecay decay = LrDecay::kConstant;
  if (!lr.decay().empty()) {
    absl::StatusOr<LrDecay> parsed = ParseLrDecay(lr.decay());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule learning_rate.decay is '", lr.decay(),
          "'; expected constant, linear or cosine"));
    }
    decay = *parsed;
  }
  if (lr.has_lr()) config->lr = lr.lr();
  config->lr_warmup_rounds = lr.warmup_rounds();
  config->lr_decay = decay;
  config->lr_decay_rounds = lr.decay_rounds();
  config->min_lr = lr.min_lr();
  return absl::OkStatus();
}

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         uint64_t n,
                                         std::vector<LocalSegment> segments,
                                         ThreadPool* pool) {
  return std::make_unique<MomentOptimizer>(config, n, std::move(segments),
                                           pool);
}

}  // namespace pserver
