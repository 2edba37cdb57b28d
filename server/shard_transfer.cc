// Shard: its whole state out and in, for the optimizer state a worker keeps
// in its own checkpoint (PyTorch's optimizer.state_dict()). The bytes are
// the checkpoint file format (server/checkpoint.h), moved in chunks of
// kShardStateChunkBytes so no message holds a model.
//
// Out: chunk 0 captures the state under the lock (a copy of the arrays) and
// serialises it outside it; the capture is kept per worker until its last
// chunk is read or the worker asks for chunk 0 again.
// In: a worker's chunks are appended in order; the last one is parsed,
// checked against this shard's configuration and installed, all under the
// rule of CheckInstall: only into a shard with no rounds of its own yet, or
// as a no-op into one that holds that very state already.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chunking.h"
#include "common/rejection.h"
#include "server/internal/shard_common.h"
#include "server/shard.h"

namespace pserver {
namespace {


uint32_t ChunkCount(uint64_t total) {
  return static_cast<uint32_t>(
      std::max<uint64_t>(1, (total + kShardStateChunkBytes - 1) / kShardStateChunkBytes));
}

// The same tensors (names, shapes, kinds, groups) in the same order; the
// groups' settings may differ (the state's are installed).
bool SameTensors(const v1::ModelLayout& a, const v1::ModelLayout& b) {
  if (a.tensors_size() != b.tensors_size()) return false;
  for (int i = 0; i < a.tensors_size(); ++i) {
    if (a.tensors(i).SerializeAsString() != b.tensors(i).SerializeAsString()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::GetShardStateResponse> Shard::GetShardState(
    const v1::GetShardStateRequest& req) {
  if (absl::Status s = CheckWorker(req.worker_id()); !s.ok()) return s;
  std::optional<Transfer> fresh;
  if (req.chunk() == 0) {
    ShardState state;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return internal::ShuttingDown();
      if (!registered_) {
        return Reject(v1::REJECT_REASON_NOT_REGISTERED,
                      absl::FailedPreconditionError(
                          "GetShardState: the shard holds no model yet; "
                          "expected a registered model"));
      }
      state = CaptureState();
    }
    fresh = Transfer{state.step, state.replica_checksum,
                     SerializeShardState(state)};
  }
  absl::MutexLock lock(&mu_);
  if (fresh.has_value()) exports_[req.worker_id()] = *std::move(fresh);
  auto it = exports_.find(req.worker_id());
  if (it == exports_.end() || it->second.step != req.step()) {
    if (req.chunk() != 0) {
      return Reject(v1::REJECT_REASON_INVALID_FIELD,
                    absl::FailedPreconditionError(absl::StrCat(
                        "GetShardState chunk ", req.chunk(), " of step ",
                        req.step(), ": this worker's capture ",
                        it == exports_.end()
                            ? std::string("is gone")
                            : absl::StrCat("is of step ", it->second.step),
                        "; expected chunk 0 first")));
    }
  }
  Transfer* t = &it->second;
  const uint32_t n = ChunkCount(t->bytes.size());
  if (req.chunk() >= n) {
    return Reject(v1::REJECT_REASON_INVALID_FIELD,
                  absl::InvalidArgumentError(absl::StrCat(
                      "GetShardState chunk is ", req.chunk(), "; expected 0..",
                      n - 1)));
  }
  v1::GetShardStateResponse resp;
  resp.set_step(t->step);
  resp.set_replica_checksum(t->checksum);
  resp.set_total_bytes(t->bytes.size());
  resp.set_chunk_bytes(kShardStateChunkBytes);
  resp.set_num_chunks(n);
  resp.set_chunk(req.chunk());
  const uint64_t begin = uint64_t{req.chunk()} * kShardStateChunkBytes;
  resp.set_data(t->bytes.substr(begin, kShardStateChunkBytes));
  if (req.chunk() + 1 == n) exports_.erase(req.worker_id());
  return resp;
}

bool Shard::TakesStateLocked() {
  return !registered_ ||
         (step_ == 0 && round_.workers_in() == 0 && !round_.summing());
}

absl::Status Shard::CheckInstall(uint64_t step, uint64_t checksum,
                                 bool* current) {
  *current = registered_ && step_ == step && replica_->checksum() == checksum;
  if (*current) return absl::OkStatus();
  if (TakesStateLocked()) return absl::OkStatus();
  return Reject(
      v1::REJECT_REASON_STATE_MISMATCH,
      absl::FailedPreconditionError(absl::StrFormat(
          "shard %d/%d holds step %d (replica checksum %016x); the state to "
          "install is of step %d (%016x); expected a shard with no rounds yet "
          "(started fresh) or one at step %d with that replica: start the "
          "shards without their checkpoints to resume from this state, or "
          "load the state saved at step %d",
          config_.shard_index, config_.num_shards, step_,
          replica_->checksum(), step, checksum, step, step_)));
}

absl::StatusOr<v1::InstallShardStateResponse> Shard::InstallShardState(
    const v1::InstallShardStateRequest& req) {
  if (absl::Status s = CheckWorker(req.worker_id()); !s.ok()) return s;
  v1::InstallShardStateResponse resp;
  const uint32_t n = ChunkCount(req.total_bytes());
  Transfer done;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return internal::ShuttingDown();
    bool current = false;
    if (absl::Status s = CheckInstall(req.step(), req.replica_checksum(),
                                      &current);
        !s.ok()) {
      imports_.erase(req.worker_id());
      return s;
    }
    resp.set_current_step(step_);
    if (current) {
      imports_.erase(req.worker_id());
      resp.set_already_current(true);
      return resp;
    }
    Transfer& t = imports_[req.worker_id()];
    if (req.chunk() == 0) {
      t = Transfer{req.step(), req.replica_checksum(), std::string()};
    }
    const uint64_t expected_chunk = t.bytes.size() / kShardStateChunkBytes;
    const bool last = req.chunk() + 1 == n;
    const uint64_t expected_size =
        last ? req.total_bytes() - uint64_t{req.chunk()} * kShardStateChunkBytes
             : kShardStateChunkBytes;
    if (req.chunk() != expected_chunk || t.step != req.step() ||
        req.total_bytes() == 0 || req.chunk() >= n ||
        req.data().size() != expected_size) {
      const std::string why = absl::StrCat(
          "InstallShardState chunk ", req.chunk(), " holds ",
          req.data().size(), " bytes of ", req.total_bytes(),
          "; expected chunk ", expected_chunk, " of ", n, " (",
          kShardStateChunkBytes, " bytes each, in order, from chunk 0)");
      imports_.erase(req.worker_id());
      return Reject(v1::REJECT_REASON_INVALID_FIELD,
                    absl::InvalidArgumentError(why));
    }
    t.bytes.append(req.data());
    if (!last) return resp;
    done = std::move(t);
    imports_.erase(req.worker_id());
  }
  // Parsed and checked outside the lock: it reads every byte.
  absl::StatusOr<ShardState> st = ParseShardState(done.bytes);
  if (!st.ok()) {
    return Reject(v1::REJECT_REASON_INVALID_PAYLOAD,
                  absl::Status(st.status().code(),
                               absl::StrCat("InstallShardState: ",
                                            st.status().message())));
  }
  std::string why = CheckpointMismatch(*st, Expectation());
  if (why.empty() && (st->step != done.step ||
                      st->replica_checksum != done.checksum)) {
    why = absl::StrFormat("it is of step %d (%016x); the request said %d (%016x)",
                          st->step, st->replica_checksum, done.step,
                          done.checksum);
  }
  if (!why.empty()) {
    return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                  absl::FailedPreconditionError(absl::StrCat(
                      "InstallShardState: the state does not fit this "
                      "shard: ", why)));
  }
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(st->layout);
  if (!slots.ok()) return slots.status();
  absl::StatusOr<std::optional<ResolvedSchedule>> schedule =
      ResolveSchedule(st->schedule_total_steps);
  if (!schedule.ok()) return schedule.status();
  if (config_.local_steps != 0 && st->local_steps != config_.local_steps) {
    return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                  absl::FailedPreconditionError(absl::StrCat(
                      "InstallShardState: the state's local_steps is ",
                      st->local_steps, "; expected ", config_.local_steps,
                      " (this shard's --local_steps)")));
  }
  absl::MutexLock lock(&mu_);
  // Checked again: another worker may have pushed (or installed) meanwhile.
  bool current = false;
  if (absl::Status s = CheckInstall(done.step, done.checksum, &current);
      !s.ok()) {
    return s;
  }
  if (!current) {
    if (registered_ && !SameTensors(layout_, st->layout)) {
      return Reject(v1::REJECT_REASON_LAYOUT_MISMATCH,
                    absl::FailedPreconditionError(
                        "InstallShardState: the state's model layout differs "
                        "from the one registered with this shard; expected "
                        "the same model"));
    }
    CommitState(*std::move(st), *slots, *std::move(schedule));
    resp.set_installed(true);
  } else {
    resp.set_already_current(true);
  }
  resp.set_current_step(step_);
  return resp;
}

}  // namespace pserver
