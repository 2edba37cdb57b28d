// Client::Leave: a planned leave (the worker was told to stop). The shard
// side is Shard::Leave (server/shard_leases.cc).
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/client.h"

namespace pserver {

absl::StatusOr<uint64_t> Client::Leave() {
  if (!registered_) {
    return absl::FailedPreconditionError(
        "Leave before Register() (or after a Leave); expected a registered "
        "client");
  }
  if (in_step()) {
    return absl::FailedPreconditionError(
        "Leave during a step; expected it between steps (after "
        "FinishStep)");
  }
  const size_t n = calls_->size();
  std::vector<size_t> all(n);
  for (size_t s = 0; s < n; ++s) all[s] = s;
  v1::LeaveRequest req;
  req.set_worker_id(options_.worker_id);
  std::vector<v1::LeaveResponse> resps;
  const std::vector<absl::Status> st = calls_->Leave(all, req, &resps);
  // Out of the rounds on the shards that answered, whatever the others did:
  // pushing again needs a new Register.
  registered_ = false;
  uint64_t step = 0;
  for (size_t s = 0; s < n; ++s) {
    if (!st[s].ok()) return st[s];
    step = resps[s].current_step() > step ? resps[s].current_step() : step;
  }
  return step;
}

}  // namespace pserver
