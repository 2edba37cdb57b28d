// Phase bounds of a compression schedule (common/schedule.h): what a phase's
// begin_* / end_* fields say, checked for form and order as the file gives
// them. CompressionSchedule::Parse checks a file with them and
// ResolvedSchedule::Make turns them into rounds of a run.
#ifndef PSERVER_COMMON_INTERNAL_SCHEDULE_BOUNDS_H_
#define PSERVER_COMMON_INTERNAL_SCHEDULE_BOUNDS_H_

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pserver/v1/schedule.pb.h"

namespace pserver::internal {

// A bound of a phase, in the units the file gave.
struct Bound {
  bool fraction = false;
  uint64_t step = 0;
  double value = 0;  // the fraction

  uint64_t Resolve(uint64_t total) const {
    if (!fraction) return step;
    // floor(f * total), exact for the fractions people write (0.1 of 9370).
    return static_cast<uint64_t>(
        std::floor(value * static_cast<double>(total) + 1e-9));
  }
  std::string Describe() const {
    return fraction ? absl::StrCat("fraction ", value)
                    : absl::StrCat("step ", step);
  }
};

// "phase 2" or "phase 2 ("warmup")", for messages.
std::string PhaseLabel(const v1::CompressionSchedule& s, size_t i);

// The bounds of every phase: begins[i] and, where given, ends[i].
struct Bounds {
  std::vector<Bound> begins;
  std::vector<std::optional<Bound>> ends;
};

// Every phase's bounds, or the first one out of form or order.
absl::StatusOr<Bounds> ReadBounds(const v1::CompressionSchedule& s);

}  // namespace pserver::internal

#endif  // PSERVER_COMMON_INTERNAL_SCHEDULE_BOUNDS_H_
