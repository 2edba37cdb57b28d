// What a shard watches round by round to tell its operator when one worker
// holds everyone up or the optimizer's updates blow up (issue 13 part 4):
//   - stragglers: the worker whose push arrives last in most rounds, and
//     how long the rounds wait for it (from the second-to-last worker's
//     push to its own);
//   - instability: the update norm far above what it was before 1-bit
//     Adam's freeze or a compression schedule's change of phase.
// Each condition is reported once per occurrence (and re-armed when it has
// clearly ended) as a line with a recommendation; the shard logs it and
// counts it, and exports the figures behind it (the worker last most often
// in the window, its share of last arrivals, the share of round time spent
// waiting for it; the worker id is a value, not a label, to keep series few)
// for the alert rules in deploy/prometheus/alerts.yml.
//
// Takes explicit times (no clock): tests script arrival orders.
#ifndef PSERVER_SERVER_ROUND_DIAGNOSTICS_H_
#define PSERVER_SERVER_ROUND_DIAGNOSTICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace pserver {

struct RoundDiagnosticsOptions {
  // Rounds the straggler share is taken over.
  uint32_t window = 100;
  // A straggler: last in at least this share of a full window, with the
  // rounds waiting for it at least min_wait_share of their time on
  // average; re-armed when its share falls below clear_share.
  double straggler_share = 0.6;
  double clear_share = 0.4;
  double min_wait_share = 0.1;
  // An update blow-up: within `after` rounds of the freeze or a change of
  // phase, an update norm above blowup_ratio x its moving average before.
  double blowup_ratio = 10.0;
  uint32_t after = 200;
  double ema_alpha = 0.05;
};

enum class RoundFindingKind { kStraggler, kUpdateBlowup };
const char* RoundFindingName(RoundFindingKind kind);  // the `kind` label

struct RoundFinding {
  RoundFindingKind kind;
  std::string message;  // one line, with the recommendation
};

// Thread-compatible: the shard calls it under its mutex.
class RoundDiagnostics {
 public:
  RoundDiagnostics(uint32_t num_workers, const RoundDiagnosticsOptions& o = {});

  // A chunk of worker w's push for the round in progress arrived at t.
  void Arrived(uint32_t w, absl::Time t);

  struct RoundEnd {
    int64_t last_worker = -1;  // -1: fewer than two workers pushed
    double wait_seconds = 0;   // how long the round waited for it
    // Over the window (once full; -1 and 0 before): the worker last most
    // often, its share of the rounds, and the share of round time the
    // rounds it was last in waited for it.
    int64_t top_worker = -1;
    double top_share = 0;
    double wait_share = 0;
    std::vector<RoundFinding> findings;
  };
  // Round `step` completed at `end` (its first push arrived at `start`)
  // with an update of norm `update_norm`; `regime_change`: it was the first
  // round after the freeze or in a new schedule phase. Forgets the round's
  // arrivals.
  RoundEnd EndRound(uint64_t step, absl::Time start, absl::Time end,
                    double update_norm, bool regime_change);

 private:
  const RoundDiagnosticsOptions o_;
  // This round: each worker's latest arrival (InfinitePast: none).
  std::vector<absl::Time> arrived_;
  // The last worker of each of the last `window` rounds (-1: none), and
  // the waits and round times in the window.
  std::vector<int64_t> last_;
  std::vector<double> wait_, round_;
  uint64_t rounds_ = 0;
  int64_t straggler_ = -1;  // reported and not yet cleared
  // Update norms.
  double update_ema_ = 0;
  bool have_ema_ = false;
  double before_change_ = 0;   // the EMA when the last change began
  uint64_t since_change_ = 0;  // rounds since it (>= after: not watching)
  bool blowup_reported_ = false;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_ROUND_DIAGNOSTICS_H_
