// The one place where absl::Status and grpc::Status meet: the codes map one
// to one, messages pass through unchanged.
#ifndef PSERVER_COMMON_GRPC_STATUS_H_
#define PSERVER_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "common/rejection.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace pserver {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

// Server side: the status to answer with; a reason attached to `s` (see
// common/rejection.h) is added to `ctx` as the "pserver-reason" trailer.
inline grpc::Status ToGrpcStatus(const absl::Status& s,
                                 grpc::ServerContextBase* ctx) {
  v1::RejectReason reason = ReasonOf(s);
  if (reason != v1::REJECT_REASON_UNSPECIFIED) {
    ctx->AddTrailingMetadata(kReasonTrailer, ReasonName(reason));
  }
  return ToGrpcStatus(s);
}

// Client side, after the call finished: the status with the server's
// "pserver-reason" trailer (if any) attached as a reason.
inline absl::Status FromGrpcStatus(const grpc::Status& s,
                                   const grpc::ClientContext& ctx) {
  absl::Status out = FromGrpcStatus(s);
  if (out.ok()) return out;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(kReasonTrailer);
  if (it == trailers.end()) return out;
  v1::RejectReason reason = ParseReasonName(
      absl::string_view(it->second.data(), it->second.size()));
  if (reason == v1::REJECT_REASON_UNSPECIFIED) return out;
  return Reject(reason, std::move(out));
}

// "OK", "INVALID_ARGUMENT", ... as gRPC spells them (metric labels).
inline std::string GrpcCodeName(absl::StatusCode code) {
  std::string s = absl::StatusCodeToString(code);
  for (char& c : s) {
    if (c == ' ') c = '_';
    else if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

}  // namespace pserver

#endif  // PSERVER_COMMON_GRPC_STATUS_H_
