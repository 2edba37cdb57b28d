// Client::FetchShardStates / InstallShardStates: the shards' whole state
// through a worker, for the optimizer checkpoints of training scripts
// (PyTorch's optimizer.state_dict() holds the optimizer's state; here it
// lives on the shards). The shard side is server/shard_transfer.cc.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/chunking.h"
#include "common/rejection.h"
#include "worker/client.h"

namespace pserver {
namespace {

std::vector<size_t> AllShards(size_t n) {
  std::vector<size_t> all(n);
  for (size_t s = 0; s < n; ++s) all[s] = s;
  return all;
}

// Whether shard status `st` holds `state` already.
bool Holds(const v1::GetStatusResponse& st, const ShardStateCopy& state) {
  return st.model_registered() && st.current_step() == state.step &&
         st.replica_checksum() == state.replica_checksum;
}

// Whether the shard's running job has gone past the state's step (rounds
// completed since it started, or it skipped to its workers' step): the
// state is older than the job's.
bool Ahead(const v1::GetStatusResponse& st, const ShardStateCopy& state) {
  return st.model_registered() &&
         (st.rounds_since_start() || st.skipped_since_start()) &&
         st.current_step() > state.step;
}

absl::Status Refusal(size_t s, size_t n, const v1::GetStatusResponse& st,
                     const ShardStateCopy& state) {
  return Reject(
      v1::REJECT_REASON_STATE_MISMATCH,
      absl::FailedPreconditionError(absl::StrFormat(
          "shard %d/%d holds step %d; the state_dict is of step %d; expected "
          "shards started fresh (they take the saved state) or at step %d "
          "(restored from their own checkpoints of that step): start the "
          "shards without their checkpoints, or load the state_dict saved at "
          "step %d",
          s, n, st.current_step(), state.step, state.step,
          st.current_step())));
}

}  // namespace

absl::StatusOr<std::vector<ShardStateCopy>> Client::FetchShardStates() {
  if (!registered_ || in_step()) {
    return absl::FailedPreconditionError(
        "FetchShardStates before Register() or during a step; expected a "
        "registered client between steps");
  }
  const size_t n = calls_->size();
  std::vector<ShardStateCopy> out(n);
  std::vector<v1::GetShardStateRequest> reqs(n);
  std::vector<v1::GetShardStateResponse> resps(n);
  std::vector<uint32_t> chunks(n, 1);
  for (uint32_t c = 0;; ++c) {
    std::vector<size_t> active;
    for (size_t s = 0; s < n; ++s) {
      if (c < chunks[s]) active.push_back(s);
    }
    if (active.empty()) break;
    for (size_t s : active) {
      reqs[s].set_worker_id(options_.worker_id);
      reqs[s].set_chunk(c);
      reqs[s].set_step(out[s].step);
    }
    std::vector<absl::Status> st = calls_->GetShardState(active, reqs, &resps);
    for (size_t i = 0; i < active.size(); ++i) {
      if (!st[i].ok()) return st[i];
      const size_t s = active[i];
      v1::GetShardStateResponse& r = resps[s];
      if (c == 0) {
        out[s].step = r.step();
        out[s].replica_checksum = r.replica_checksum();
        out[s].bytes.reserve(r.total_bytes());
        chunks[s] = r.num_chunks();
      }
      if (r.chunk() != c || r.step() != out[s].step) {
        return absl::DataLossError(absl::StrCat(
            "shard ", s, " answered GetShardState chunk ", r.chunk(),
            " of step ", r.step(), "; expected chunk ", c, " of step ",
            out[s].step));
      }
      out[s].bytes.append(r.data());
      if (c + 1 == chunks[s] && out[s].bytes.size() != r.total_bytes()) {
        return absl::DataLossError(absl::StrCat(
            "shard ", s, " sent ", out[s].bytes.size(), " state bytes; it "
            "announced ", r.total_bytes()));
      }
    }
  }
  return out;
}

absl::StatusOr<Client::InstallOutcome> Client::InstallShardStates(
    const std::vector<ShardStateCopy>& states) {
  if (!registered_ || in_step()) {
    return absl::FailedPreconditionError(
        "InstallShardStates before Register() or during a step; expected a "
        "registered client between steps");
  }
  const size_t n = calls_->size();
  if (states.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the state holds ", states.size(), " shards; this job has ", n,
        " (expected the same --shards as the job that saved it)"));
  }
  const std::vector<size_t> all = AllShards(n);
  std::vector<v1::GetStatusResponse> status;
  // Decide for every shard before changing any: take, keep, or refuse.
  std::vector<size_t> fresh;
  for (const absl::Status& st : calls_->Status(all, &status)) {
    if (!st.ok()) return st;
  }
  std::vector<size_t> ahead, other;
  for (size_t s = 0; s < n; ++s) {
    if (Holds(status[s], states[s])) continue;
    if (Ahead(status[s], states[s])) {
      ahead.push_back(s);
    } else if (status[s].takes_state()) {  // no rounds of its own
      fresh.push_back(s);
    } else {
      other.push_back(s);  // the job's, or a mismatch: decided below
    }
  }
  InstallOutcome outcome;
  if (!ahead.empty()) {
    // The job went on while this worker was away. A shard beside it that
    // holds a model of another step with neither a round nor a skip since
    // it started (restored from a checkpoint) is the job's too: the rounds
    // skip it to their step. A fresh one in this mix is refused: a live
    // worker's replica, not this older state, is what it must take.
    if (!fresh.empty()) {
      return Refusal(fresh[0], n, status[fresh[0]], states[fresh[0]]);
    }
    outcome.shards_ahead = true;
    return outcome;
  }
  if (!other.empty()) {
    return Refusal(other[0], n, status[other[0]], states[other[0]]);
  }
  int& installed = outcome.installed;
  if (!fresh.empty() && options_.worker_id != 0) {
    // Worker 0 installs; the others wait for it, as at Register.
    const absl::Time give_up = absl::Now() + options_.retry_budget;
    while (!fresh.empty()) {
      if (absl::Now() > give_up) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shard ", fresh[0], " is still at step ",
            status[fresh[0]].current_step(), " after ",
            absl::FormatDuration(options_.retry_budget), "; expected worker 0 "
            "to install step ", states[fresh[0]].step, " from its "
            "state_dict (every worker calls load_state_dict)"));
      }
      absl::SleepFor(absl::Milliseconds(100));
      for (const absl::Status& st : calls_->Status(fresh, &status)) {
        if (!st.ok()) return st;
      }
      std::vector<size_t> still;
      for (size_t s : fresh) {
        if (Holds(status[s], states[s])) continue;
        if (!status[s].takes_state()) return Refusal(s, n, status[s], states[s]);
        still.push_back(s);
      }
      fresh = std::move(still);
    }
  } else if (!fresh.empty()) {
    std::vector<v1::InstallShardStateRequest> reqs(n);
    std::vector<v1::InstallShardStateResponse> resps(n);
    for (uint32_t c = 0; !fresh.empty(); ++c) {
      for (size_t s : fresh) {
        const ShardStateCopy& state = states[s];
        const uint64_t begin = uint64_t{c} * kShardStateChunkBytes;
        reqs[s].set_worker_id(options_.worker_id);
        reqs[s].set_chunk(c);
        reqs[s].set_total_bytes(state.bytes.size());
        reqs[s].set_step(state.step);
        reqs[s].set_replica_checksum(state.replica_checksum);
        reqs[s].set_data(state.bytes.substr(begin, kShardStateChunkBytes));
      }
      std::vector<absl::Status> st =
          calls_->InstallShardState(fresh, reqs, &resps);
      std::vector<size_t> still;
      for (size_t i = 0; i < fresh.size(); ++i) {
        const size_t s = fresh[i];
        if (!st[i].ok()) {
          return absl::Status(
              st[i].code(),
              absl::StrCat("installing the state_dict's state into shard ", s,
                           " (shards before it are installed): ",
                           st[i].message()));
        }
        if (resps[s].installed()) {
          ++installed;
        } else if (!resps[s].already_current()) {
          if ((uint64_t{c} + 1) * kShardStateChunkBytes >= states[s].bytes.size()) {
            return absl::DataLossError(absl::StrCat(
                "shard ", s, " took every chunk of the state but did not "
                "install it"));
          }
          still.push_back(s);
        }
      }
      fresh = std::move(still);
    }
  }
  if (installed == 0 && replica_.step() == states[0].step) return outcome;
  // The shards are at the state's step now: join them there, as a worker
  // (re)starting does, and take their replica.
  const std::vector<float> weights(replica_.weights().begin(),
                                   replica_.weights().end());
  const v1::ModelLayout layout = layout_;
  if (absl::Status st = Register(layout, weights); !st.ok()) return st;
  return outcome;
}

}  // namespace pserver
