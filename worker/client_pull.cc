// Client: the pull of a step's weights from every shard, chunk by chunk
// (PullAll), with the checks each answer must pass (CheckAnswer); the
// push half of a step is client_step.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/mix.h"
#include "common/norms.h"
#include "worker/client.h"

namespace pserver {

absl::Status Client::CheckAnswer(size_t s, uint64_t step, bool registering,
                                 const v1::PullResponse& resp,
                                 bool* ahead) const {
  // At Register a shard one step ahead (see Register) answers with its
  // newer snapshot.
  *ahead = registering && resp.kind() == v1::PULL_KIND_SNAPSHOT &&
           resp.step() == step + 1 && !relaxed();
  // Under ssp and async the answer is the shard's newest step.
  const bool newer = relaxed() && resp.step() >= step;
  if (resp.step() != step && !*ahead && !newer) {
    return absl::AbortedError(absl::StrCat(
        "shard ", s, " answered with step ", resp.step(), "; expected ", step));
  }
  return absl::OkStatus();
}

absl::Status Client::PullAll(uint64_t step, std::vector<bool> snapshot,
                             const PendingPush* push) {
  const size_t n = calls_->size();
  // What the first chunk of each shard's answer said; every other chunk
  // must agree (one step, one kind, one checksum).
  struct Head {
    bool seen = false;
    v1::PullKind kind = v1::PULL_KIND_UNSPECIFIED;
    uint64_t step = 0;
    uint64_t checksum = 0;
    v1::OptimizerStage stage = v1::OPTIMIZER_STAGE_UNSPECIFIED;
    bool ahead = false;
    uint32_t phase = 0;
  };
  std::vector<Head> head(n);
  // The step asked of each shard: `step`, or under ssp and async (each
  // shard's slice at its own step) the one after the slice's, answered
  // with the shard's newest once this worker's push there is applied.
  std::vector<uint64_t> want(n, step);
  if (relaxed() && push != nullptr) {
    for (size_t s = 0; s < n; ++s) want[s] = replica_.step(s) + 1;
  }
  // The replica stages the decoded slices (worker/replica.h); nothing
  // changes unless every shard's answer verified.
  replica_.BeginUpdate();
  std::vector<size_t> todo(n);
  for (size_t s = 0; s < n; ++s) todo[s] = s;
  // Per shard, why its last attempt did not verify (for the final error).
  std::vector<std::string> mismatch(n);
  for (int attempt = 0; attempt < 4 && !todo.empty(); ++attempt) {
    std::vector<uint32_t> chunks;
    for (size_t s : todo) {
      chunks.push_back(plans_[s].num_chunks());
      head[s] = Head();
    }
    // A refusal no retry fixes, per shard (set by `finish`).
    std::vector<absl::Status> fatal(n);
    bool behind = false;
    std::vector<bool> interrupted;
    std::vector<absl::Status> pulled = calls_->PullChunks(
        todo, chunks,
        [&](size_t s, uint32_t c, v1::PullRequest* q) {
          q->Clear();
          q->set_worker_id(options_.worker_id);
          q->set_step(want[s]);
          q->set_chunk(c);
          q->set_want_snapshot(snapshot[s]);
          if (round_norm_sq_.has_value()) {
            q->set_round_squared_norm(*round_norm_sq_);
          }
          if (!snapshot[s]) {
            q->set_replica_step(static_cast<int64_t>(replica_.step(s)));
            // Verified against the shard when the replica was last
            // committed.
            q->set_replica_checksum(replica_.checksum(s));
          } else {
            q->set_replica_step(-1);
          }
          return absl::OkStatus();
        },
        [&](size_t s, uint32_t c, const v1::PullResponse& resp) {
          if (push != nullptr && !relaxed() && resp.step() > want[s]) {
            // The rounds went on without this worker: it stalled past its
            // lease with this pull in flight, or a rejoin found the shard
            // further on. Nothing is staged from this answer.
            behind = true;
            return absl::AbortedError(absl::StrCat(
                "shard ", s, " answered with step ", resp.step(),
                "; expected ", want[s]));
          }
          bool is_ahead = false;
          if (absl::Status a = CheckAnswer(s, want[s], push == nullptr, resp,
                                           &is_ahead);
              !a.ok()) {
            fatal[s] = a;
            return a;
          }
          if (absl::Status p = CheckPhase(s, resp.schedule_phase());
              !p.ok()) {
            fatal[s] = p;
            return p;
          }
          if (resp.round_skipped()) {
            round_skipped_.store(true, std::memory_order_relaxed);
          }
          Head& h = head[s];
          if (!h.seen) {
            h = Head{true,         resp.kind(),  resp.step(),
                     resp.replica_checksum(), resp.stage(), is_ahead,
                     resp.schedule_phase()};
          } else if (resp.kind() != h.kind || resp.step() != h.step ||
                     resp.replica_checksum() != h.checksum) {
            // The shard moved on between chunks: take a snapshot.
            return absl::DataLossError(absl::StrCat(
                "shard ", s, "'s chunks answered different steps or kinds: ",
                "chunk 0 ", v1::PullKind_Name(h.kind), " of step ", h.step,
                ", chunk ", c, " ", v1::PullKind_Name(resp.kind()),
                " of step ", resp.step()));
          }
          const ChunkPlan& plan = plans_[s];
          if (resp.chunk() != c) {
            fatal[s] = absl::InvalidArgumentError(absl::StrCat(
                "pull from shard ", s, " (", calls_->address(s),
                "): answered chunk ", resp.chunk(), " for chunk ", c));
            return fatal[s];
          }
          uint64_t pulled_bytes = PayloadBytes(resp.weights());
          for (const v1::EncodedTensor& d : resp.later_deltas()) {
            pulled_bytes += PayloadBytes(d);
          }
          metrics_.CountPull(pulled_bytes, Fp32Bytes(plan.size(c)));
          if (c == 0 && resp.kind() == v1::PULL_KIND_SNAPSHOT) {
            metrics_.CountSnapshot();
          }
          if (absl::Status st =
                  replica_.StageChunk(s, plan.begin(c), plan.size(c), resp);
              !st.ok()) {
            fatal[s] = absl::Status(
                st.code(), absl::StrCat("pull from shard ", s, " (",
                                        calls_->address(s), ") chunk ", c,
                                        ": ", st.message()));
            return fatal[s];
          }
          return absl::OkStatus();
        },
        &interrupted);
    if (behind) return Resync();
    std::vector<size_t> again;
    // Stopped because another shard's pull failed: asked again as before
    // once that one is recovered (staging a chunk again is idempotent).
    std::vector<size_t> resume;
    for (size_t i = 0; i < todo.size(); ++i) {
      const size_t s = todo[i];
      if (!fatal[s].ok()) return fatal[s];
      if (interrupted[i]) {
        mismatch[s] = std::string(pulled[i].message());
        resume.push_back(s);
        continue;
      }
      if (absl::IsDataLoss(pulled[i])) {
        metrics_.CountChecksumMismatch();
        mismatch[s] = std::string(pulled[i].message());
        again.push_back(s);
        continue;
      }
      if (!pulled[i].ok()) {
        // At Register there is no push to resend: every refusal fails.
        const Recovery r =
            push == nullptr ? Recovery::kFail : RecoveryFor(pulled[i]);
        if (r == Recovery::kFail) return pulled[i];
        absl::StatusOr<uint64_t> now = Recover(s, r, *push);
        if (!now.ok()) return now.status();
        // The shard is past the step asked for: the rounds went on.
        if (!relaxed() && *now > want[s]) return Resync();
        mismatch[s] = absl::StrCat("refused: ", pulled[i].message());
        again.push_back(s);
        continue;
      }
      absl::Status st = replica_.FinishStage(s, head[s].checksum);
      if (absl::IsDataLoss(st)) {
        metrics_.CountChecksumMismatch();
        mismatch[s] = absl::StrCat(st.message(), " (",
                                   v1::PullKind_Name(head[s].kind),
                                   " of step ", head[s].step, ")");
        again.push_back(s);
      } else if (!st.ok()) {
        return st;
      }
    }
    for (size_t s : again) snapshot[s] = true;  // re-sync what did not verify
    todo = std::move(again);
    todo.insert(todo.end(), resume.begin(), resume.end());
  }
  if (!todo.empty()) {
    return absl::DataLossError(absl::StrCat(
        "shard ", todo[0], " (", calls_->address(todo[0]), ") did not "
        "answer a pull of step ", want[todo[0]], " that verified in 4 "
        "attempts; the last: ", mismatch[todo[0]]));
  }
  // Stage changes need the frozen preconditioner (an RPC that can fail):
  // fetched before anything is committed. An ahead shard may already be
  // past the freeze; the next push follows the lagging shards.
  std::vector<std::optional<Preconditioner>> d(n);
  for (size_t s = 0; s < n; ++s) {
    if (head[s].ahead) continue;
    absl::StatusOr<std::optional<Preconditioner>> p =
        PrepareStage(s, head[s].stage);
    if (!p.ok()) return p.status();
    d[s] = *std::move(p);
  }
  if (relaxed()) {
    std::vector<uint64_t> steps(n);
    for (size_t s = 0; s < n; ++s) steps[s] = head[s].step;
    replica_.Commit(steps);
  } else {
    replica_.Commit(step);
  }
  for (size_t s = 0; s < n; ++s) {
    if (head[s].ahead) continue;
    if (absl::Status st = encoders_[s]->SetStage(head[s].stage,
                                                 std::move(d[s]));
        !st.ok()) {
      return st;
    }
    if (absl::Status st = SetPhase(s, head[s].phase); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Client::SetClipNorm(float max_norm) {
  if (in_step()) {
    return absl::FailedPreconditionError(
        "SetClipNorm during a step; call it before Step or StartStep");
  }
  if (!(max_norm >= 0.0f) || !std::isfinite(max_norm)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_norm is ", max_norm, "; expected a finite value >= 0 (0: no "
        "clipping of the round's mean)"));
  }
  clip_norm_ = max_norm;
  return absl::OkStatus();
}

absl::StatusOr<double> Client::RoundSquaredNorm(uint64_t step,
                                                absl::Status* refused,
                                                size_t* shard) {
  const size_t n = calls_->size();
  std::vector<size_t> all(n);
  for (size_t s = 0; s < n; ++s) all[s] = s;
  std::vector<double> part(n, 0.0);
  std::vector<absl::Status> pulled = calls_->PullChunks(
      all, std::vector<uint32_t>(n, 1),
      [&](size_t, uint32_t, v1::PullRequest* q) {
        q->Clear();
        q->set_worker_id(options_.worker_id);
        q->set_step(step);
        q->set_norm_part(true);
        q->set_replica_step(-1);
        return absl::OkStatus();
      },
      [&](size_t s, uint32_t, const v1::PullResponse& resp) {
        if (resp.step() != step) {
          return absl::FailedPreconditionError(absl::StrCat(
              "shard ", s, " answered norm_part of step ", resp.step(),
              "; expected ", step));
        }
        part[s] = resp.norm_part();
        return absl::OkStatus();
      });
  double total = 0;
  for (size_t s = 0; s < n; ++s) {
    if (!pulled[s].ok()) {
      *refused = pulled[s];  // with the shard's reason, for recovery
      *shard = s;
      return absl::Status(pulled[s].code(),
                          absl::StrCat("norm part of the round's mean from "
                                       "shard ", s, " (", calls_->address(s),
                                       "): ", pulled[s].message()));
    }
    total += part[s];  // in shard order: every worker adds the same
  }
  return total;
}

}  // namespace pserver
