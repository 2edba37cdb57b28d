// Shard: who the rounds wait for, between Registers: leases that expire
// (the reaper drops a silent worker) and workers that leave when told to
// stop (Leave, a planned leave: not counted as dropped).
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/rejection.h"
#include "server/internal/shard_common.h"
#include "server/shard.h"

namespace pserver {

using internal::ShuttingDown;

absl::Status Shard::DroppedWorker(uint32_t w) const {
  const std::string why =
      leases_.left(w) ? "left the rounds (Leave)"
                      : "was dropped from the rounds (no call within the "
                        "lease timeout)";
  return Reject(
      v1::REJECT_REASON_DROPPED_WORKER,
      absl::AbortedError(absl::StrCat(
          "worker_id ", w, " ", why, "; step ", step_,
          " goes on without it; ",
          leases_.rejoining(w)
              ? absl::StrCat("it is counted again from step ", step_ + 1)
              : "call Register to rejoin")));
}

absl::StatusOr<v1::LeaveResponse> Shard::Leave(const v1::LeaveRequest& req) {
  if (absl::Status s = CheckWorker(req.worker_id()); !s.ok()) return s;
  const uint32_t w = req.worker_id();
  std::vector<Ready> ready;
  v1::LeaveResponse resp;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ShuttingDown();
    resp.set_current_step(step_);
    if (!worker_registered_[w] && !leases_.live(w) && !leases_.rejoining(w)) {
      resp.set_was_live(false);  // not in the job: nothing to change
      return resp;
    }
    const bool was = leases_.Leave(w);
    worker_registered_[w] = false;
    metrics_->SetWorkersRegistered(RegisteredCount());
    resp.set_was_live(was);
    if (was) {
      // A push it made to the round in progress still counts (the round
      // holds it); the rounds stop waiting for the rest of it now.
      std::fprintf(stderr,
                   "pserver: shard %u: worker %u left at step %lu (it was "
                   "told to stop); the rounds go on without it\n",
                   config_.shard_index, w, static_cast<unsigned long>(step_));
      metrics_->AddLeftWorker();
      PublishLiveness();
      if (registered_) ready = Drain();
    }
  }
  for (Ready& r : ready) r();
  return resp;
}

void Shard::PublishLiveness() { metrics_->SetWorkersLive(leases_.live_count()); }

std::vector<Shard::Ready> Shard::ReapLeases() {
  if (!registered_ || !leases_.enabled()) return {};
  auto busy = [this](uint32_t w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // Called by leases_ inside Expire, i.e. with mu_ held.
    return round_.pushed_any(w) || !deferred_[w].empty() ||
           waiters_.IsWaiting(w);
  };
  auto dropped = leases_.Expire(busy);
  if (dropped.empty()) return {};
  for (const auto& [w, silent] : dropped) {
    std::fprintf(stderr,
                 "pserver: shard %u: worker %u dropped at step %lu (no call "
                 "for %s); the rounds go on without it\n",
                 config_.shard_index, w, static_cast<unsigned long>(step_),
                 absl::FormatDuration(silent).c_str());
    metrics_->AddDroppedWorker();
  }
  PublishLiveness();
  return Drain();
}

void Shard::CheckLeases() {
  std::vector<Ready> ready;
  {
    absl::MutexLock lock(&mu_);
    ready = ReapLeases();
  }
  for (Ready& r : ready) r();
}

void Shard::ReaperLoop() {
  const absl::Duration period =
      std::min(absl::Seconds(1), config_.lease_timeout / 4);
  while (true) {
    std::vector<Ready> ready;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return reaper_stop_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&stop), period);
      if (reaper_stop_) return;
      ready = ReapLeases();
    }
    for (Ready& r : ready) r();
  }
}


}  // namespace pserver
