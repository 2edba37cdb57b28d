// What the client does when a shard refuses a call, decided on the shard's
// machine-readable reason (pserver.v1.RejectReason, common/rejection.h) and
// never on the gRPC code alone: FAILED_PRECONDITION is both "the shard
// restarted behind you" (recoverable) and "you push in the wrong gradient
// space" (a misconfiguration that re-registering cannot fix).
//
// Retriable transport failures (UNAVAILABLE, DEADLINE_EXCEEDED) never get
// here: worker/shard_calls.h retries them within the retry budget.
//
// Pure functions: safe from any thread.
#ifndef PSERVER_WORKER_RECOVERY_H_
#define PSERVER_WORKER_RECOVERY_H_

#include "absl/status/status.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

enum class Recovery {
  // Report the shard's error as it is: the worker, the shard or the payload
  // is misconfigured or malformed (wrong space, codec, layout, worker count,
  // shard index, size), or the reason is unknown. Nothing was changed.
  kFail,
  // The shard lost this worker or this step (it restarted, from a checkpoint
  // behind the worker or from nothing): register again with resume_step =
  // the worker's step (its replica slice stands in for lost weights), push
  // the step again, and pull a snapshot.
  kRejoinAndResend,
  // The round went on without this worker (its lease expired, or the step
  // it pushed is over): register again to be counted from the next round
  // and pull that round's snapshot; the push is not resent.
  kRejoinNextRound,
};

// The recovery for a call refused with `refused`. REQUIRES: !refused.ok().
//   NOT_REGISTERED, FUTURE_STEP, PULL_BEFORE_PUSH  -> kRejoinAndResend
//   DROPPED_WORKER, STALE_STEP                     -> kRejoinNextRound
//   anything else, and no reason at all            -> kFail
Recovery RecoveryFor(const absl::Status& refused);

}  // namespace pserver

#endif  // PSERVER_WORKER_RECOVERY_H_
