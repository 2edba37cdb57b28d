// Private to server/: the refusals and helpers the Shard's files share.
#ifndef PSERVER_SERVER_INTERNAL_SHARD_COMMON_H_
#define PSERVER_SERVER_INTERNAL_SHARD_COMMON_H_


#include "absl/status/status.h"
#include "common/rejection.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {
namespace internal {

inline absl::Status NotRegistered() {
  return Reject(v1::REJECT_REASON_NOT_REGISTERED,
                absl::FailedPreconditionError(
                    "no model is registered on this shard; call Register "
                    "first"));
}

inline absl::Status ShuttingDown() {
  return Reject(v1::REJECT_REASON_SHUTTING_DOWN,
                absl::UnavailableError("shard is shutting down"));
}

}  // namespace internal
}  // namespace pserver

#endif  // PSERVER_SERVER_INTERNAL_SHARD_COMMON_H_
