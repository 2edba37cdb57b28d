// Shard: the push path under relaxed consistency (ssp, async;
// server/round_policy.h has the rules), the opening of rounds, and the
// round timer that ends an ssp round's patience.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rejection.h"
#include "server/shard.h"

namespace pserver {

absl::Status Shard::PushRelaxed(std::shared_ptr<v1::PushRequest>& request,
                                const ValidatedTensor& valid,
                                uint64_t wire_bytes,
                                std::function<void()>& on_summed, bool* queued,
                                v1::PushResponse* resp) {
  const v1::PushRequest& req = *request;
  const uint32_t w = req.worker_id();
  const uint32_t c = req.chunk();
  const uint64_t tag = req.step();
  const int64_t last = last_pushed_[w];
  if (tag > step_) {
    return Reject(v1::REJECT_REASON_FUTURE_STEP,
                  absl::FailedPreconditionError(absl::StrCat(
                      "step is ", tag, "; the shard is at step ", step_,
                      " (pull step ", step_, " first)")));
  }
  if (last > static_cast<int64_t>(tag)) {
    resp->set_duplicate(true);  // an older push, resent
    return absl::OkStatus();
  }
  auto accept = [&](bool defer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    metrics_->AddReceived(req.gradient().codec(), wire_bytes,
                          Fp32Bytes(req.gradient().num_elements()));
    const bool overflow = req.overflow();
    Round::Push push =
        Round::Push::Own(std::move(request), valid, std::move(on_summed));
    push.overflow = overflow;
    if (defer) {
      deferred_[w].emplace(c, std::move(push));
    } else {
      Land(w, c, std::move(push), tag);
    }
    *queued = true;
  };
  if (last == static_cast<int64_t>(tag)) {
    // Another chunk of the push it made last, or a resend of one.
    const int64_t at = landed_[w];
    if (at < static_cast<int64_t>(step_)) {
      resp->set_duplicate(true);  // its round completed
    } else if (at == static_cast<int64_t>(step_)) {
      if (round_.pushed(w, c)) {
        resp->set_duplicate(true);
      } else {
        accept(/*defer=*/false);
      }
    } else if (deferred_[w].count(c) != 0) {
      resp->set_duplicate(true);
    } else {
      accept(/*defer=*/true);
    }
    return absl::OkStatus();
  }
  // A new push.
  if (!leases_.live(w)) return DroppedWorker(w);
  const uint64_t staleness = step_ - tag;
  if (staleness > policy_.max_staleness()) {
    // Computed on weights older than the bound allows (the rounds stopped
    // waiting for the worker, or it was not live): nothing is applied; the
    // worker pulls the current weights and goes on from there.
    metrics_->AddDroppedStalePush();
    resp->set_round_lost(true);
    return absl::OkStatus();
  }
  if (absl::Status form = CheckForm(req); !form.ok()) {
    const uint64_t freeze = optimizer_->freeze_at();
    if (freeze > 0 && tag < freeze && step_ >= freeze) {
      // Computed before 1-bit Adam froze, in the warmup's form: it cannot
      // join a compression-stage round. Dropped, as a lost round.
      resp->set_round_lost(true);
      return absl::OkStatus();
    }
    return form;
  }
  last_pushed_[w] = static_cast<int64_t>(tag);
  hyper_.Record(req);  // ssp/async: the newest step's values win
  // A round that passed this worker over in some chunk is closed to it: the
  // whole push goes to the next round, so a push never splits.
  const bool defer = round_.passed_over(w);
  landed_[w] = static_cast<int64_t>(defer ? step_ + 1 : step_);
  accept(defer);
  return absl::OkStatus();
}

void Shard::Land(uint32_t w, uint32_t c, Round::Push push, uint64_t tag) {
  const absl::Time now = clock_->Now();
  const uint64_t staleness = step_ - tag;
  push.weight = policy_.Weight(staleness);
  if (round_.received() == 0) round_start_ = now;
  const bool first = !round_.pushed_any(w);
  round_.Queue(w, std::move(push), c);
  diagnostics_.Arrived(w, now);
  if (!first) return;
  metrics_->ObserveStaleness(staleness);
  if (staleness == 0) {
    late_[w] = false;
  } else if (late_[w]) {
    // Stale only because no round waited for it: on time for its own.
    for (auto it = deadlines_.rbegin(); it != deadlines_.rend(); ++it) {
      if (it->first == tag) {
        if (now <= it->second) late_[w] = false;
        break;
      }
    }
  }
  if (!policy_.has_patience() || staleness != 0) return;
  // Patience: (1 + patience) times the median arrival of the workers that
  // computed on this round's weights, from the round's opening, once at
  // least half of the round's cohort is in.
  arrivals_.push_back(now - round_open_);
  uint32_t cohort = 0;
  for (uint32_t v = 0; v < late_.size(); ++v) {
    if (leases_.live(v) && !late_[v] && CurrentVersion(v) >= step_) ++cohort;
  }
  if (arrivals_.size() * 2 < cohort) return;
  std::vector<absl::Duration> sorted = arrivals_;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2,
                   sorted.end());
  const absl::Duration median = sorted[sorted.size() / 2];
  deadline_ = round_open_ + median * (1.0 + policy_.config().patience);
  ++deadline_seq_;
}

std::vector<Shard::Ready> Shard::ClearRound() {
  std::vector<Ready> dropped = round_.Clear();
  presence_.Clear();
  round_clip_ = 0.0f;
  clip_held_ = false;
  hyper_.Clear();  // the dropped round's values bind no later round
  for (std::map<uint32_t, Round::Push>& d : deferred_) {
    for (auto& [c, push] : d) {
      if (push.on_done) dropped.push_back(std::move(push.on_done));
    }
    d.clear();
  }
  return dropped;
}

void Shard::OpenRound() {
  const absl::Time now = clock_->Now();
  round_open_ = now;
  arrivals_.clear();
  deadline_ = absl::InfiniteFuture();
  patience_over_ = false;
  released_ = false;
  release_at_ = policy_.has_patience()
                    ? now + std::max(kMinLaggardWait,
                                     RecentRoundDuration() * kLaggardWaitRounds)
                    : absl::InfiniteFuture();
  ++deadline_seq_;
  for (uint32_t w = 0; w < deferred_.size(); ++w) {
    if (deferred_[w].empty()) continue;
    std::map<uint32_t, Round::Push> pushes = std::move(deferred_[w]);
    deferred_[w].clear();
    for (auto& [c, push] : pushes) {
      Land(w, c, std::move(push), static_cast<uint64_t>(last_pushed_[w]));
    }
  }
}

absl::Duration Shard::RecentRoundDuration() const {
  if (round_durations_.empty()) return absl::ZeroDuration();
  std::vector<absl::Duration> d(round_durations_.begin(),
                                round_durations_.end());
  std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
  return d[d.size() / 2];
}

absl::Time Shard::NextTimerEvent() const {
  absl::Time next = absl::InfiniteFuture();
  if (!patience_over_) next = deadline_;
  if (!released_) next = std::min(next, release_at_);
  return next;
}

void Shard::CheckPatience() {
  std::vector<Ready> ready;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_ || shutting_down_) return;
    const absl::Time now = clock_->Now();
    bool changed = false;
    if (!patience_over_ && now >= deadline_) {
      patience_over_ = true;
      changed = true;
    }
    if (!released_ && now >= release_at_) {
      released_ = true;
      changed = true;
    }
    if (!changed) return;
    ++deadline_seq_;
    ready = Drain();
  }
  for (Ready& r : ready) r();
}

void Shard::TimerLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const uint64_t seq = deadline_seq_;
      auto changed = [this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return timer_stop_ || deadline_seq_ != seq;
      };
      const absl::Time next = NextTimerEvent();
      if (next == absl::InfiniteFuture()) {
        mu_.Await(absl::Condition(&changed));
      } else {
        const absl::Duration left = next - clock_->Now();
        if (left > absl::ZeroDuration()) {
          mu_.AwaitWithTimeout(absl::Condition(&changed), left);
        }
      }
      if (timer_stop_) return;
      if (deadline_seq_ != seq) continue;  // a new deadline: wait for it
    }
    CheckPatience();
  }
}

}  // namespace pserver
