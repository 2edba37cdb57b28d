// The one place where absl::Status and grpc::Status meet: the codes map one
// to one, messages pass through unchanged.
#ifndef PSERVER_COMMON_GRPC_STATUS_H_
#define PSERVER_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
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
