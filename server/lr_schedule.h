// The shards' own learning-rate schedule: a function of the round, so a
// checkpoint (which keeps the step) restores the rate in force exactly.
//
//   round t < W:          lr * (t + 1) / W                     (linear warmup)
//   then s = min(t - W, D) / D over the decay's D rounds:
//     constant            lr
//     linear              min_lr + (lr - min_lr) * (1 - s)
//     cosine              min_lr + (lr - min_lr) * (1 + cos(pi s)) / 2
// and min_lr from round W + D on. These are DeepSpeed's WarmupDecayLR (with
// a linear warmup) and nanoGPT's warmup + cosine shapes.
#ifndef PSERVER_SERVER_LR_SCHEDULE_H_
#define PSERVER_SERVER_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {

enum class LrDecay { kConstant, kLinear, kCosine };

struct LrSchedule {
  float lr = 1e-3f;             // the peak (--lr)
  uint64_t warmup_rounds = 0;   // W; 0: no warmup
  LrDecay decay = LrDecay::kConstant;
  uint64_t decay_rounds = 0;    // D; > 0 for linear and cosine
  float min_lr = 0.0f;          // where the decay ends, <= lr
};

// The learning rate of round `round` (the round that takes the shard from
// step `round` to `round + 1`).
float ScheduledLr(const LrSchedule& s, uint64_t round);

// INVALID_ARGUMENT naming the flag: min_lr outside [0, lr], or a linear or
// cosine decay over 0 rounds.
absl::Status ValidateLrSchedule(const LrSchedule& s);

// "constant", "linear", "cosine"; INVALID_ARGUMENT for anything else.
absl::StatusOr<LrDecay> ParseLrDecay(absl::string_view name);
std::string LrDecayName(LrDecay decay);

}  // namespace pserver

#endif  // PSERVER_SERVER_LR_SCHEDULE_H_
