// Client: what it does when the shards went on without it or lost state.
// A refused call of a step is recovered shard by shard (Recover, Rejoin); a
// worker that finds the rounds ahead of it (it stalled past its lease while
// a pull was in flight) rejoins every shard and takes the rounds' weights
// (Resync). At Register, a shard that lost its model while the job is under
// way waits for a worker holding the rounds' weights (AwaitLostModels), and
// a shard restored from a checkpoint behind the rounds skips to them
// (CatchUpLaggingShards).
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/client.h"

namespace pserver {

absl::StatusOr<uint64_t> Client::Recover(size_t s, Recovery recovery,
                                         const PendingPush& push) {
  // The shard may fail again while it is recovered (killed twice in a row):
  // a refusal that registering again fixes is recovered again, a few times.
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<uint64_t> now = RecoverOnce(s, recovery, push);
    if (now.ok() || attempt == kAttempts) return now;
    const Recovery again = RecoveryFor(now.status());
    if (again == Recovery::kFail) return now;
    recovery = again;
  }
}

absl::StatusOr<uint64_t> Client::RecoverOnce(size_t s, Recovery recovery,
                                         const PendingPush& push) {
  const uint64_t step = replica_.step(s);
  if (recovery == Recovery::kRejoinNextRound) {
    // This round went on without us on that shard: register again to be
    // counted from the next round, and take that round's weights.
    return Rejoin(s, 0);
  }
  // The shard is behind this step or lost this worker's registration (it
  // restarted): register again, letting it catch up to `step`.
  absl::StatusOr<uint64_t> now = Rejoin(s, step);
  if (!now.ok()) return now.status();
  // Another worker already brought the shard past this step: the round
  // this push was for is over (lost on that shard); just pull.
  if (*now > step) return *now;
  // The same chunks again. A shard that came back in warmup expects the
  // warmup codec in RAW space: then every chunk is encoded anew.
  const bool reencode = sent_space_[s] != v1::GRADIENT_SPACE_RAW &&
                        encoders_[s]->stage() != v1::OPTIMIZER_STAGE_COMPRESSION;
  if (absl::Status pushed = Resend(s, reencode, push); !pushed.ok()) {
    return pushed;
  }
  return *now;
}

absl::Status Client::Resend(size_t s, bool reencode, const PendingPush& push) {
  const uint64_t step = replica_.step(s);
  // An fp32 chunk (not kept; the same bytes), a chunk not sent in this
  // step, or any chunk when the shard's chunking changed, is encoded now.
  const uint32_t chunks = plans_[s].num_chunks();
  const std::vector<v1::EncodedTensor> kept =
      sent_[s].size() == chunks ? sent_[s] : std::vector<v1::EncodedTensor>();
  const v1::GradientSpace space = sent_space_[s];
  const bool momentum = sent_momentum_[s] != 0;
  bool overflow = false;
  {
    absl::MutexLock lock(&no_gradient_mu_);
    overflow = overflow_;
  }
  return calls_->PushChunks(
      {s}, {chunks},
      [&](size_t, uint32_t c, v1::PushRequest* req) {
        if (reencode || kept.empty() ||
            kept[c].codec() == v1::CODEC_UNSPECIFIED) {
          return EncodeChunk(s, c, push.gradient, push.bound, req);
        }
        req->set_worker_id(options_.worker_id);
        req->set_step(step);
        req->set_chunk(c);
        req->set_space(space);
        *req->mutable_hyper() = hyper_;
        // Every header field EncodeChunk sets: the round's clip and the
        // overflow must be the same on every shard.
        req->set_momentum(momentum);
        req->set_clip_norm(clip_norm_);
        req->set_overflow(overflow);
        *req->mutable_gradient() = kept[c];
        return absl::OkStatus();
      },
      [](size_t, uint32_t, const v1::PushResponse&) {
        return absl::OkStatus();
      })[0];
}

absl::StatusOr<uint64_t> Client::Rejoin(size_t s, uint64_t resume_step) {
  v1::RegisterRequest req = RegisterRequestFor(s, resume_step);
  std::vector<v1::RegisterResponse> resps(calls_->size());
  if (absl::Status st = calls_->Register(s, req, &resps[s]); !st.ok()) {
    return st;
  }
  // A shard that lost its model takes this worker's replica as weights.
  if (absl::Status st = SendWeights(
          {s}, [&](size_t) { return replica_.slice(s); }, resume_step, &resps);
      !st.ok()) {
    return st;
  }
  const v1::RegisterResponse& resp = resps[s];
  if (absl::Status st = SetChunking(s, resp); !st.ok()) return st;
  metrics_.CountRejoin();
  metrics_.Note(absl::StrCat("rejoined shard ", s, " (", calls_->address(s),
                             ") at step ", resp.current_step()));
  if (absl::Status st = SetStage(s, resp.stage()); !st.ok()) return st;
  if (absl::Status st = SetPhase(s, resp.schedule_phase()); !st.ok()) {
    return st;
  }
  return resp.current_step();
}

absl::Status Client::Resync() {
  const size_t n = calls_->size();
  metrics_.Note(absl::StrCat("the rounds went on without this worker at step ",
                             replica_.step(), "; rejoining every shard"));
  // Each shard counts this worker again from its current round; in a
  // synchronous run those rounds are at most one step apart (none can
  // complete two rounds without this worker's push), and the lagging
  // shards' step is pulled as at Register. A worker stalled again while
  // doing this finds the rounds ahead once more: tried a few times.
  constexpr int kAttempts = 3;
  absl::Status last;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    // resume_step = this worker's step: a shard that lost its model takes
    // the replica's slice at that step (no other shard is then more than
    // one step ahead of it: this worker's pushes are missing there).
    std::vector<uint64_t> steps(n);
    for (size_t s = 0; s < n; ++s) {
      absl::StatusOr<uint64_t> now = Rejoin(s, replica_.step());
      if (!now.ok()) return now.status();
      steps[s] = *now;
    }
    // A shard restored from a checkpoint behind the others skips to them.
    const uint64_t top = *std::max_element(steps.begin(), steps.end());
    for (size_t s = 0; s < n; ++s) {
      if (steps[s] + 1 >= top) continue;
      absl::StatusOr<uint64_t> now = Rejoin(s, top);
      if (!now.ok()) return now.status();
      steps[s] = *now;
    }
    const uint64_t lo = *std::min_element(steps.begin(), steps.end());
    const uint64_t hi = *std::max_element(steps.begin(), steps.end());
    if (hi > lo + 1) {
      last = absl::AbortedError(absl::StrCat(
          "after rejoining, the shards are at steps ", lo, " to ", hi,
          "; expected at most one step apart"));
      continue;
    }
    last = PullAll(lo, std::vector<bool>(n, true), /*push=*/nullptr);
    if (!absl::IsAborted(last)) return last;
  }
  return last;
}

absl::Status Client::AwaitLostModels() {
  const size_t n = calls_->size();
  std::vector<size_t> all(n);
  for (size_t s = 0; s < n; ++s) all[s] = s;
  const absl::Time deadline = absl::Now() + options_.retry_budget;
  bool noted = false;
  for (;;) {
    std::vector<v1::GetStatusResponse> status;
    std::vector<absl::Status> got = calls_->Status(all, &status);
    for (const absl::Status& st : got) {
      if (!st.ok()) return st;
    }
    // The job is under way when some shard has completed rounds; a shard
    // without a model then lost it (killed before its first checkpoint) and
    // must not be installed from initial weights: a worker still holding
    // the rounds' weights reinstalls it from its replica when it next
    // pushes there (Rejoin).
    size_t lost = n, ahead = n;
    for (size_t s = 0; s < n; ++s) {
      if (!status[s].model_registered()) {
        lost = s;
      } else if (status[s].current_step() > 0 &&
                 (ahead == n ||
                  status[s].current_step() > status[ahead].current_step())) {
        ahead = s;
      }
    }
    if (lost == n || ahead == n) return absl::OkStatus();
    const std::string what = absl::StrCat(
        "shard ", lost, " (", calls_->address(lost), ") has no model while "
        "shard ", ahead, " (", calls_->address(ahead), ") is at step ",
        status[ahead].current_step(), ": it lost its state before its first "
        "checkpoint");
    if (absl::Now() >= deadline) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ", and no worker holding the rounds' weights reinstalled it "
          "within ", absl::FormatDuration(options_.retry_budget),
          "; restart the job (the other shards from their checkpoints)"));
    }
    if (!noted) {
      metrics_.Note(absl::StrCat(what, "; waiting for a worker holding the "
                                 "rounds' weights to reinstall it"));
      noted = true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status Client::CatchUpLaggingShards(
    std::vector<v1::RegisterResponse>* resps) {
  uint64_t hi = 0;
  for (const v1::RegisterResponse& r : *resps) {
    hi = std::max<uint64_t>(hi, r.current_step());
  }
  // A shard restored from a checkpoint behind the rounds (the others went
  // on) skips to them, as it does when a live worker pushes there; its lost
  // rounds are logged and counted by the shard. Without this, workers that
  // all restarted would refuse to start, forever.
  for (size_t s = 0; s < resps->size(); ++s) {
    if ((*resps)[s].current_step() + 1 >= hi) continue;
    if ((*resps)[s].current_step() == 0) {
      // Step 0 holds none of the job's rounds: a shard that a worker is
      // installing a saved state into (InstallShardStates goes shard by
      // shard) must not skip ahead with its initial weights, which would
      // throw the state away in silence. Register waits for it (moved_).
      moved_ = true;
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " (", calls_->address(s), ") is at step 0 and another "
          "at step ", hi, "; expected a saved state being installed into it "
          "(load_state_dict on worker 0) to reach it, or else restart the "
          "job (the shards from their checkpoints)"));
    }
    metrics_.Note(absl::StrCat("shard ", s, " (", calls_->address(s),
                               ") is at step ", (*resps)[s].current_step(),
                               " and the others at ", hi,
                               "; asking it to skip to step ", hi));
    if (absl::Status st =
            calls_->Register(s, RegisterRequestFor(s, hi), &(*resps)[s]);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace pserver
