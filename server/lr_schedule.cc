#include "server/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pserver {

float ScheduledLr(const LrSchedule& s, uint64_t round) {
  if (round < s.warmup_rounds) {
    return static_cast<float>(double{s.lr} * static_cast<double>(round + 1) /
                              static_cast<double>(s.warmup_rounds));
  }
  if (s.decay == LrDecay::kConstant || s.decay_rounds == 0) return s.lr;
  const double t = static_cast<double>(
      std::min(round - s.warmup_rounds, s.decay_rounds));
  const double frac = t / static_cast<double>(s.decay_rounds);
  const double span = double{s.lr} - double{s.min_lr};
  const double kept = s.decay == LrDecay::kLinear
                          ? 1.0 - frac
                          : 0.5 * (1.0 + std::cos(M_PI * frac));
  return static_cast<float>(double{s.min_lr} + span * kept);
}

absl::Status ValidateLrSchedule(const LrSchedule& s) {
  if (!(std::isfinite(s.min_lr) && s.min_lr >= 0 && s.min_lr <= s.lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_lr is ", s.min_lr, "; expected 0 .. lr (", s.lr, ")"));
  }
  if (s.decay != LrDecay::kConstant && s.decay_rounds == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr_decay_rounds is 0 with lr_decay ",
                     LrDecayName(s.decay), "; expected >= 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LrDecay> ParseLrDecay(absl::string_view name) {
  if (name == "constant") return LrDecay::kConstant;
  if (name == "linear") return LrDecay::kLinear;
  if (name == "cosine") return LrDecay::kCosine;
  return absl::InvalidArgumentError(absl::StrCat(
      "lr_decay is '", name, "'; expected constant, linear or cosine"));
}

std::string LrDecayName(LrDecay decay) {
  switch (decay) {
    case LrDecay::kConstant: return "constant";
    case LrDecay::kLinear: return "linear";
    case LrDecay::kCosine: return "cosine";
  }
  return "unknown";
}

}  // namespace pserver
