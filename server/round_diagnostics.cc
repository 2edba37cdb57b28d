#include "server/round_diagnostics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace pserver {

const char* RoundFindingName(RoundFindingKind kind) {
  switch (kind) {
    case RoundFindingKind::kStraggler:
      return "straggler";
    case RoundFindingKind::kUpdateBlowup:
      return "update_blowup";
  }
  return "unknown";
}

RoundDiagnostics::RoundDiagnostics(uint32_t num_workers,
                                   const RoundDiagnosticsOptions& o)
    : o_(o),
      arrived_(num_workers, absl::InfinitePast()),
      last_(std::max<uint32_t>(1, o.window), -1),
      wait_(last_.size(), 0.0),
      round_(last_.size(), 0.0),
      since_change_(o.after) {}

void RoundDiagnostics::Arrived(uint32_t w, absl::Time t) {
  if (w < arrived_.size()) arrived_[w] = std::max(arrived_[w], t);
}

RoundDiagnostics::RoundEnd RoundDiagnostics::EndRound(uint64_t step,
                                                      absl::Time start,
                                                      absl::Time end,
                                                      double update_norm,
                                                      bool regime_change) {
  RoundEnd r;
  // The last and second-to-last arrivals (a worker's last chunk).
  int64_t last = -1;
  absl::Time t_last = absl::InfinitePast(), t_second = absl::InfinitePast();
  int pushed = 0;
  for (size_t w = 0; w < arrived_.size(); ++w) {
    const absl::Time t = arrived_[w];
    if (t == absl::InfinitePast()) continue;
    ++pushed;
    if (t > t_last) {
      t_second = t_last;
      t_last = t;
      last = static_cast<int64_t>(w);
    } else if (t > t_second) {
      t_second = t;
    }
  }
  std::fill(arrived_.begin(), arrived_.end(), absl::InfinitePast());
  if (pushed >= 2) {
    r.last_worker = last;
    r.wait_seconds = absl::ToDoubleSeconds(t_last - t_second);
  }
  const size_t slot = rounds_ % last_.size();
  last_[slot] = r.last_worker;
  wait_[slot] = r.wait_seconds;
  round_[slot] = std::max(0.0, absl::ToDoubleSeconds(end - start));
  ++rounds_;

  if (rounds_ >= last_.size()) {
    // The worker last most often in the window.
    std::vector<uint32_t> count(arrived_.size(), 0);
    double wait = 0, total = 0;
    for (size_t i = 0; i < last_.size(); ++i) {
      if (last_[i] >= 0) ++count[static_cast<size_t>(last_[i])];
      total += round_[i];
    }
    const auto top = std::max_element(count.begin(), count.end());
    const int64_t w = top - count.begin();
    for (size_t i = 0; i < last_.size(); ++i) {
      if (last_[i] == w) wait += wait_[i];
    }
    const double share = static_cast<double>(*top) / last_.size();
    const double wait_share = total > 0 ? wait / total : 0;
    if (*top > 0) {
      r.top_worker = w;
      r.top_share = share;
      r.wait_share = wait_share;
    }
    if (straggler_ >= 0 &&
        static_cast<double>(count[static_cast<size_t>(straggler_)]) /
                last_.size() < o_.clear_share) {
      straggler_ = -1;
    }
    if (straggler_ < 0 && share >= o_.straggler_share &&
        wait_share >= o_.min_wait_share) {
      straggler_ = w;
      r.findings.push_back(
          {RoundFindingKind::kStraggler,
           absl::StrFormat(
               "diagnostic: straggler at round %d: worker %d pushed last in "
               "%d of the last %d rounds, and the rounds waited %.1f ms for "
               "it on average (%.0f%% of their time). Check that worker's "
               "host (CPU load, network); if it is slow by nature, give it "
               "a smaller share of the data or drop it from the job",
               step, w, *top, last_.size(), 1e3 * wait / std::max(1u, *top),
               100 * wait_share)});
    }
  }

  // Update norms around the freeze and phase changes.
  if (std::isfinite(update_norm)) {
    if (regime_change && have_ema_) {
      before_change_ = update_ema_;
      since_change_ = 0;
      blowup_reported_ = false;
    }
    if (since_change_ < o_.after && before_change_ > 0 &&
        update_norm > o_.blowup_ratio * before_change_ && !blowup_reported_) {
      blowup_reported_ = true;
      r.findings.push_back(
          {RoundFindingKind::kUpdateBlowup,
           absl::StrFormat(
               "diagnostic: instability at round %d: the update norm %.4g is "
               "%.0fx its average before the freeze or codec change %d "
               "rounds ago (%.4g). Freeze later (--freeze_step), warm up "
               "with a denser codec for longer, or lower the learning rate",
               step, update_norm, update_norm / before_change_,
               since_change_, before_change_)});
    }
    if (since_change_ < o_.after) ++since_change_;
    update_ema_ = have_ema_ ? (1 - o_.ema_alpha) * update_ema_ +
                                  o_.ema_alpha * update_norm
                            : update_norm;
    have_ema_ = true;
  }
  return r;
}

}  // namespace pserver
