// Shard: the pull side. Pulls of an available step are answered at once
// (from the replica tracker's shared answers); pulls of the round in
// progress wait in PullWaiters until it completes.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fp32_tensor.h"
#include "common/rejection.h"
#include "server/internal/shard_common.h"
#include "server/shard.h"

namespace pserver {

using internal::NotRegistered;
using internal::ShuttingDown;

std::vector<Shard::Ready> Shard::WakeWaiters() {
  std::vector<Ready> ready;
  const absl::Time now = clock_->Now();
  for (PullWaiters::Waiter& w : waiters_.TakeReady(step_)) {
    if (w.since != absl::InfinitePast()) {
      metrics_->AddPullWait(absl::ToDoubleSeconds(now - w.since));
    }
    if (w.request.norm_part()) {
      // Parked before its round was summed; that round was not clipped
      // (its pushes had no clip_norm) unless it is the last clipped one.
      const uint64_t t = w.request.step();
      const bool clipped =
          clipped_step_ >= 0 && t == static_cast<uint64_t>(clipped_step_) + 1;
      absl::Status st = clipped ? absl::OkStatus()
                                : Reject(v1::REJECT_REASON_HYPER_MISMATCH,
                                         absl::FailedPreconditionError(
                                             absl::StrCat(
                                                 "norm_part of step ", t,
                                                 "; round ", t - 1,
                                                 " had no clip_norm")));
      PullAnswer answer = clipped ? NormPartAnswer(t, clipped_part_) : nullptr;
      ready.push_back([done = std::move(w.done), st, answer] {
        done(st, answer);
      });
      continue;
    }
    PullAnswer answer = AnswerPull(w.request);
    ready.push_back([done = std::move(w.done), answer = std::move(answer)] {
      done(absl::OkStatus(), answer);
    });
  }
  return ready;
}

PullAnswer Shard::AnswerPull(const v1::PullRequest& req) {
  if (policy_.relaxed()) {
    uint64_t& v = version_[req.worker_id()];
    v = std::max(v, step_);
  }
  PullAnswer answer = replica_->Answer(req, step_, optimizer_->stage(),
                                        PhaseAt(step_));
  metrics_->AddSent(answer->codec, answer->payload_bytes,
                    Fp32Bytes(answer->num_elements));
  return answer;
}

uint64_t Shard::Pull(const v1::PullRequest& req, PullDone done) {
  absl::Status error;
  PullAnswer answer;
  std::vector<Ready> ready;  // a clipped round this pull completed
  uint64_t parked = 0;
  {
    absl::MutexLock lock(&mu_);
    const uint32_t w = req.worker_id();
    if (shutting_down_) {
      error = ShuttingDown();
    } else if (!registered_) {
      error = NotRegistered();
    } else if (absl::Status s = CheckWorker(w); !s.ok()) {
      error = s;
    } else if (absl::Status c = CheckChunk(req.chunk()); !c.ok()) {
      error = c;
    } else if (leases_.Touch(w),
               req.step() > step_ + policy_.max_pull_ahead()) {
      error = Reject(v1::REJECT_REASON_FUTURE_STEP,
                     absl::FailedPreconditionError(absl::StrCat(
                         "step is ", req.step(), "; the shard is at step ",
                         step_, ", so at most step ",
                         step_ + policy_.max_pull_ahead(), " can be pulled")));
    } else if (req.step() == step_ + 1 && leases_.live(w) &&
               !round_.queued_any(w) &&
               last_pushed_[w] < static_cast<int64_t>(step_)) {
      // The round cannot complete without this worker's push: waiting would
      // deadlock. Happens when a restart lost the push.
      error = Reject(v1::REJECT_REASON_PULL_BEFORE_PUSH,
                     absl::FailedPreconditionError(absl::StrCat(
                         "worker_id ", w, " has not pushed step ", step_,
                         " to this shard; push it, then pull step ",
                         req.step())));
    } else if (PullForClip(req, &done, &error, &answer, &parked, &ready)) {
      if (parked != 0) return parked;
    } else if (policy_.relaxed()) {
      // Read your writes: the pull waits until this worker's latest push
      // is applied, then gets the newest weights (possibly later than
      // asked for).
      const uint64_t want = std::max<uint64_t>(
          req.step(), static_cast<uint64_t>(landed_[w] + 1));
      if (want > step_) {
        v1::PullRequest parked = req;
        parked.set_step(want);
        return waiters_.Add(parked, std::move(done), clock_->Now());
      }
      answer = AnswerPull(req);
    } else if (req.step() > step_) {
      return waiters_.Add(req, std::move(done), clock_->Now());
    } else {
      answer = AnswerPull(req);
    }
  }
  for (Ready& r : ready) r();
  done(error, std::move(answer));
  return 0;
}

void Shard::CancelPull(uint64_t id, absl::Status why) {
  PullDone done;
  {
    absl::MutexLock lock(&mu_);
    done = waiters_.Remove(id);
  }
  if (done) done(why, nullptr);
}

absl::StatusOr<v1::PullResponse> Shard::PullBlocking(const v1::PullRequest& req,
                                                     absl::Duration timeout) {
  struct Result {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    PullAnswer answer ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  uint64_t id = Pull(req, [result](absl::Status s, PullAnswer a) {
    absl::MutexLock l(&result->mu);
    result->status = std::move(s);
    result->answer = std::move(a);
    result->done = true;
  });
  absl::MutexLock l(&result->mu);
  auto is_done = [&result]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(result->mu) {
    return result->done;
  };
  if (!result->mu.AwaitWithTimeout(absl::Condition(&is_done), timeout)) {
    result->mu.Unlock();
    CancelPull(id, absl::DeadlineExceededError(absl::StrCat(
                       "step ", req.step(), " not ready within ",
                       absl::FormatDuration(timeout))));
    result->mu.Lock();
    result->mu.Await(absl::Condition(&is_done));
  }
  if (!result->status.ok()) return result->status;
  return result->answer->Parse();
}

absl::StatusOr<v1::GetFrozenVarianceResponse> Shard::GetFrozenVariance(
    const v1::GetFrozenVarianceRequest& req) {
  if (absl::Status s = CheckWorker(req.worker_id()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (!registered_) return NotRegistered();
  if (!optimizer_->frozen()) {
    if (config_.optimizer.kind != OptimizerKind::kOneBitAdam) {
      return Reject(v1::REJECT_REASON_NOT_FROZEN,
                    absl::FailedPreconditionError(absl::StrCat(
                        "the optimizer is ", OptimizerName(config_.optimizer.kind),
                        "; only onebit_adam freezes its variance")));
    }
    return Reject(v1::REJECT_REASON_NOT_FROZEN,
                  absl::FailedPreconditionError(absl::StrCat(
                      "variance is frozen from step ", optimizer_->freeze_at(),
                      "; the shard is at step ", step_)));
  }
  const uint32_t c = req.chunk();
  if (absl::Status s = CheckChunk(c); !s.ok()) return s;
  const ChunkPlan& plan = round_.plan();
  v1::GetFrozenVarianceResponse resp;
  resp.set_freeze_step(optimizer_->freeze_at());
  resp.set_eps(opt_.eps);
  resp.set_chunk(c);
  SetFp32(optimizer_->frozen_variance().subspan(plan.begin(c), plan.size(c)),
          resp.mutable_variance());
  return resp;
}

}  // namespace pserver
