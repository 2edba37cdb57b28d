// Private to server/: the refusals and helpers the Shard's files share.
#ifndef PSERVER_SERVER_INTERNAL_SHARD_COMMON_H_
#define PSERVER_SERVER_INTERNAL_SHARD_COMMON_H_

#include <cstring>

#include "absl/status/status.h"
#include "absl/types/span.h"
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

// *t = v as CODEC_FP32 (little-endian hosts).
inline void SetFp32(absl::Span<const float> v, v1::EncodedTensor* t) {
  t->Clear();
  t->set_codec(v1::CODEC_FP32);
  t->set_num_elements(v.size());
  t->mutable_payload()->resize(v.size() * sizeof(float));
  if (!v.empty()) {
    std::memcpy(t->mutable_payload()->data(), v.data(),
                v.size() * sizeof(float));
  }
}

}  // namespace internal
}  // namespace pserver

#endif  // PSERVER_SERVER_INTERNAL_SHARD_COMMON_H_
