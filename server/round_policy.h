// What a round waits for, which stale pushes it takes and how it weighs
// them. The shard asks its policy instead of hard-coding one rule, so the
// consistency modes (docs/consistency.md) are data here, not branches all
// over Shard.
//
// Versions: the shard's step is the version of its weights (rounds
// completed). A push is tagged with the version the worker computed it on
// (the step it pulled); it lands in the round open when it arrives, and its
// staleness is that round minus its tag.
//
//   bsp    every round waits for every live worker (today's rule).
//   ssp s  round k waits for a live worker only while a push from it could
//          still be at most s versions stale: for w computing on version
//          v_w, while v_w + s <= k. So no applied push is more than s
//          stale and no worker runs more than s versions ahead of the
//          slowest. With s = 0 that is every worker: bsp, bit for bit.
//          With s > 0 the round also waits for the workers computing on its
//          own version (they pulled the newest weights: "the cohort"), but
//          only for a patience: once at least half of the cohort came in
//          and (1 + patience) times their median arrival time has passed
//          since the round opened, it stops waiting for the rest. A worker
//          cut off that way is "late": later rounds do not wait for it
//          (while the bound allows) until one of its pushes arrives within
//          the patience of the round it was computed for again (landing
//          in a later round only because nobody waited for it). So a worker slower than the
//          others by nature costs the others one patience, once, and then
//          contributes its pushes a round or two stale; a worker that was
//          only unlucky once is waited for again as soon as it keeps up.
//          Waiting at the bound is itself limited: with several shards a
//          worker late on one shard may be waiting for its own push on
//          another, whose round waits at its bound for a worker waiting
//          on the first (each shard's rounds are its own). So a round
//          waits for a worker at the bound (or one of the cohort, should
//          the patience not have started) for at most kLaggardWaitRounds
//          times the median duration of the newest rounds (at least
//          kMinLaggardWait);
//          then it goes on, and the worker's push, if
//          it then arrives more than s stale, is dropped (acknowledged as
//          round_lost and counted), never applied: no applied push is
//          ever more than s stale, and no cycle of waits lasts.
//   async  a round never waits for a worker that has not pushed into it:
//          it applies whatever pushes are in (one worker's, typically) and
//          the next round takes what arrives next. Staleness is unbounded
//          and recorded.
// In every mode a round that has some chunk of a worker's push waits for
// the rest of that push (a push never splits across rounds), and a pull
// waits until the pulling worker's own latest push is applied (read your
// writes); the pull gets the newest version, which in ssp and async may be
// later than the one asked for.
#ifndef PSERVER_SERVER_ROUND_POLICY_H_
#define PSERVER_SERVER_ROUND_POLICY_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pserver {

enum class Consistency { kBsp = 0, kSsp = 1, kAsync = 2 };

const char* ConsistencyName(Consistency c);
// "bsp", "ssp" or "async"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<Consistency> ParseConsistency(absl::string_view s);

// The largest --max_staleness accepted (a bound beyond any useful one).
inline constexpr uint32_t kMaxStaleness = 1000;
// ssp with s > 0: how long a round waits for a worker at the bound (see
// above), in median durations of the newest rounds, and at least.
inline constexpr double kLaggardWaitRounds = 10;
inline constexpr absl::Duration kMinLaggardWait = absl::Milliseconds(100);

struct ConsistencyConfig {
  Consistency mode = Consistency::kBsp;
  // ssp: the bound s on a push's staleness (0 behaves as bsp).
  uint32_t max_staleness = 0;
  // Weigh each push in its round's mean by 1 / max(1, staleness) (Zhang et
  // al. 2016, "Staleness-aware async-SGD"), instead of 1.
  bool scale_by_staleness = false;
  // ssp with s > 0: how long past the cohort's median arrival a round waits
  // for the rest of the cohort, as a fraction of that median (1: until
  // twice the median; docs/consistency.md has the measurements behind it).
  double patience = 1.0;
};

// INVALID_ARGUMENT naming the field for a config out of range.
absl::Status ValidateConsistencyConfig(const ConsistencyConfig& c);
// "bsp", "ssp(s=4)", "async", with ",scaled" when scale_by_staleness.
std::string DescribeConsistency(const ConsistencyConfig& c);

// What the policy knows of one worker when the round `round` asks whether
// to wait for it.
struct WorkerView {
  bool live = false;
  // Some chunk of its push is in this round: the round takes all of it.
  bool in_round = false;
  // The version its next push will be computed on (the step it pulled).
  uint64_t version = 0;
  // A round's patience cut it off, and no push of it has landed in the
  // round it was computed for since.
  bool late = false;
};

// Thread-compatible and stateless: the shard calls it under its mutex.
class RoundPolicy {
 public:
  explicit RoundPolicy(const ConsistencyConfig& config) : config_(config) {}

  const ConsistencyConfig& config() const { return config_; }
  Consistency mode() const { return config_.mode; }
  // Whether pulls may be answered with a later version than asked for and
  // pushes may be stale: any mode but bsp (ssp with s = 0 included, which
  // then never happens).
  bool relaxed() const { return config_.mode != Consistency::kBsp; }

  // Whether round `round` waits for worker w's push. `patience_over`: the
  // round's patience for its cohort ran out; `laggards_released`: its
  // wait for workers at the bound did (ssp with s > 0).
  bool WaitsFor(const WorkerView& w, uint64_t round, bool patience_over,
                bool laggards_released = false) const {
    if (!w.live) return false;
    if (w.in_round) return true;
    switch (config_.mode) {
      case Consistency::kBsp:
        return true;
      case Consistency::kSsp:
        if (w.version + config_.max_staleness <= round) {
          return config_.max_staleness == 0 || !laggards_released;
        }
        return w.version >= round && !w.late && !patience_over &&
               !laggards_released;
      case Consistency::kAsync:
        return false;
    }
    return true;
  }

  // The largest staleness a push may have when it lands.
  uint64_t max_staleness() const {
    switch (config_.mode) {
      case Consistency::kBsp:
        return 0;
      case Consistency::kSsp:
        return config_.max_staleness;
      case Consistency::kAsync:
        return std::numeric_limits<uint64_t>::max();
    }
    return 0;
  }

  // Whether a round may stop waiting for its cohort after a patience
  // (and so needs a timer).
  bool has_patience() const {
    return config_.mode == Consistency::kSsp && config_.max_staleness > 0;
  }

  // A push's weight in its round's mean.
  float Weight(uint64_t staleness) const {
    if (!config_.scale_by_staleness || staleness <= 1) return 1.0f;
    return 1.0f / static_cast<float>(staleness);
  }

  // How far ahead of the shard's completed rounds a pull may ask: a pull of
  // step current + k waits for k <= this and is refused beyond.
  uint64_t max_pull_ahead() const { return 1; }

 private:
  ConsistencyConfig config_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_ROUND_POLICY_H_
