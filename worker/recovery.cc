#include "worker/recovery.h"

#include "common/rejection.h"

namespace pserver {

Recovery RecoveryFor(const absl::Status& refused) {
  switch (ReasonOf(refused)) {
    case v1::REJECT_REASON_NOT_REGISTERED:
    case v1::REJECT_REASON_FUTURE_STEP:
    case v1::REJECT_REASON_PULL_BEFORE_PUSH:
      return Recovery::kRejoinAndResend;
    case v1::REJECT_REASON_DROPPED_WORKER:
    case v1::REJECT_REASON_STALE_STEP:
      return Recovery::kRejoinNextRound;
    default:
      // Among them WRONG_SPACE, CONFIG_MISMATCH, LAYOUT_MISMATCH,
      // UNKNOWN_WORKER (worker_id >= the shard's num_workers), the payload
      // reasons, and a shard that attached no reason: re-registering would
      // be refused again or would hide the misconfiguration.
      return Recovery::kFail;
  }
}

}  // namespace pserver
