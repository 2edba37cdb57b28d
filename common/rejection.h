// Machine-readable reasons for refused requests (pserver.v1.RejectReason).
// Inside the process a reason rides on the absl::Status as a payload; at the
// RPC edge (common/grpc_status.h) it becomes the "pserver-reason" trailing
// metadata entry and back, so a client decides what to recover from on the
// reason rather than on the gRPC code alone.
//
// Usage:
//   return Reject(v1::REJECT_REASON_FUTURE_STEP,
//                 absl::FailedPreconditionError("step is 7; ..."));
//   ...
//   if (ReasonOf(status) == v1::REJECT_REASON_FUTURE_STEP) { /* rejoin */ }
#ifndef PSERVER_COMMON_REJECTION_H_
#define PSERVER_COMMON_REJECTION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

// The trailing metadata key that carries the reason's enum name.
inline constexpr char kReasonTrailer[] = "pserver-reason";

// `status` with `reason` attached. REQUIRES: !status.ok().
absl::Status Reject(v1::RejectReason reason, absl::Status status);

// The reason attached to `status`, or REJECT_REASON_UNSPECIFIED.
v1::RejectReason ReasonOf(const absl::Status& status);

// The reason's metric label: the enum name without its prefix, lower case
// ("future_step"); "unspecified" for REJECT_REASON_UNSPECIFIED.
std::string ReasonLabel(v1::RejectReason reason);

// Every defined reason except UNSPECIFIED, in enum order: the fixed set of
// label values of the rejection counter.
absl::Span<const v1::RejectReason> AllRejectReasons();

// The enum name sent on the wire, and its parse (UNSPECIFIED for a name this
// build does not know).
std::string ReasonName(v1::RejectReason reason);
v1::RejectReason ParseReasonName(absl::string_view name);

}  // namespace pserver

#endif  // PSERVER_COMMON_REJECTION_H_
