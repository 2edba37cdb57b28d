// Phase bounds (common/internal/schedule_bounds.h) and their resolution to
// the rounds of a run (ResolvedSchedule).
#include "common/internal/schedule_bounds.h"

#include <algorithm>
#include <utility>

#include "common/schedule.h"

namespace pserver {
namespace internal {
namespace {

absl::StatusOr<std::optional<Bound>> ReadBound(bool has_step, uint64_t step,
                                               bool has_fraction,
                                               double fraction,
                                               const char* what) {
  if (has_step && has_fraction) {
    return absl::InvalidArgumentError(absl::StrCat(
        "both ", what, "_step and ", what, "_fraction are set; expected one"));
  }
  if (has_fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "_fraction is ", fraction, "; expected 0..1"));
    }
    return std::optional<Bound>(Bound{true, 0, fraction});
  }
  if (has_step) return std::optional<Bound>(Bound{false, step, 0});
  return std::optional<Bound>();
}

}  // namespace

std::string PhaseLabel(const v1::CompressionSchedule& s, size_t i) {
  const std::string& name = s.phases(static_cast<int>(i)).name();
  return name.empty() ? absl::StrCat("phase ", i)
                      : absl::StrCat("phase ", i, " (\"", name, "\")");
}

absl::StatusOr<Bounds> ReadBounds(const v1::CompressionSchedule& s) {
  Bounds b;
  for (int i = 0; i < s.phases_size(); ++i) {
    const v1::SchedulePhase& p = s.phases(i);
    auto fail = [&](const absl::Status& st) {
      return absl::InvalidArgumentError(
          absl::StrCat(PhaseLabel(s, i), ": ", st.message()));
    };
    absl::StatusOr<std::optional<Bound>> begin =
        ReadBound(p.has_begin_step(), p.begin_step(), p.has_begin_fraction(),
                  p.begin_fraction(), "begin");
    if (!begin.ok()) return fail(begin.status());
    absl::StatusOr<std::optional<Bound>> end =
        ReadBound(p.has_end_step(), p.end_step(), p.has_end_fraction(),
                  p.end_fraction(), "end");
    if (!end.ok()) return fail(end.status());
    if (!begin->has_value()) {
      if (i != 0) {
        return fail(absl::InvalidArgumentError(
            "begin is missing; expected begin_step or begin_fraction (only "
            "the first phase may leave it out)"));
      }
      *begin = Bound{};  // step 0
    }
    if (i == 0 && ((*begin)->fraction ? (*begin)->value != 0.0
                                      : (*begin)->step != 0)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "begins at ", (*begin)->Describe(),
          "; expected the first phase to begin at step 0 (no rounds may be "
          "left without a phase)")));
    }
    b.begins.push_back(**begin);
    b.ends.push_back(*end);
  }
  // What can be checked before the run's length is known: bounds in the
  // same units must increase, and an end must be the next phase's begin.
  for (size_t i = 0; i + 1 < b.begins.size(); ++i) {
    const Bound& a = b.begins[i];
    const Bound& n = b.begins[i + 1];
    if (a.fraction == n.fraction &&
        (a.fraction ? !(n.value > a.value) : !(n.step > a.step))) {
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i + 1), ": begins at ", n.Describe(), ", not after ",
          PhaseLabel(s, i), "'s begin (", a.Describe(),
          "); expected phases in increasing order of their begin"));
    }
  }
  for (size_t i = 0; i < b.ends.size(); ++i) {
    if (!b.ends[i].has_value()) continue;
    const Bound& e = *b.ends[i];
    if (i + 1 == b.begins.size()) {
      if (!(e.fraction ? e.value == 1.0 : false)) {
        return absl::InvalidArgumentError(absl::StrCat(
            PhaseLabel(s, i), ": the last phase ends at ", e.Describe(),
            "; expected it to run to the end of the run (leave the end out, "
            "or end_fraction: 1)"));
      }
      continue;
    }
    const Bound& n = b.begins[i + 1];
    if (e.fraction == n.fraction &&
        (e.fraction ? e.value != n.value : e.step != n.step)) {
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i), ": ends at ", e.Describe(), " but ",
          PhaseLabel(s, i + 1), " begins at ", n.Describe(), "; expected ",
          e.fraction ? (e.value < n.value ? "no gap" : "no overlap")
                     : (e.step < n.step ? "no gap" : "no overlap"),
          " between phases (an end equal to the next begin)"));
    }
  }
  return b;
}

}  // namespace internal

using internal::Bounds;
using internal::PhaseLabel;
using internal::ReadBounds;

absl::StatusOr<ResolvedSchedule> ResolvedSchedule::Make(
    std::shared_ptr<const CompressionSchedule> schedule,
    uint64_t total_steps) {
  const v1::CompressionSchedule& s = schedule->proto();
  if (schedule->uses_fractions() && total_steps == 0) {
    return absl::InvalidArgumentError(
        "total_steps is 0; expected the run's length in rounds (the "
        "schedule bounds phases by fractions of the run)");
  }
  // Parse validated the bounds' form; only the resolved order is new.
  absl::StatusOr<Bounds> bounds = ReadBounds(s);
  if (!bounds.ok()) return bounds.status();
  ResolvedSchedule r;
  r.schedule_ = std::move(schedule);
  r.total_steps_ = total_steps;
  for (size_t i = 0; i < bounds->begins.size(); ++i) {
    const uint64_t b = bounds->begins[i].Resolve(total_steps);
    if (i > 0 && b <= r.begins_.back()) {
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i), " begins at ", bounds->begins[i].Describe(),
          " = round ", b, " of ", total_steps, ", not after ",
          PhaseLabel(s, i - 1), "'s round ", r.begins_.back(),
          "; expected every phase to have at least one round"));
    }
    if (i > 0 && bounds->ends[i - 1].has_value() &&
        bounds->ends[i - 1]->Resolve(total_steps) != b) {
      const uint64_t e = bounds->ends[i - 1]->Resolve(total_steps);
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i - 1), " ends at round ", e, " but ",
          PhaseLabel(s, i), " begins at round ", b, " (of ", total_steps,
          "); expected ", e < b ? "no gap" : "no overlap",
          " between phases"));
    }
    r.begins_.push_back(b);
  }
  return r;
}

size_t ResolvedSchedule::PhaseAt(uint64_t step) const {
  auto it = std::upper_bound(begins_.begin(), begins_.end(), step);
  return it == begins_.begin() ? 0
                               : static_cast<size_t>(it - begins_.begin()) - 1;
}

}  // namespace pserver
