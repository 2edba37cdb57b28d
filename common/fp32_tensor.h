// The one builder of CODEC_FP32 tensors (initial weights, snapshots, the
// frozen variance): `v` as little-endian IEEE-754 binary32, the byte order of
// every host pserver builds on. Pure function: safe from any thread.
#ifndef PSERVER_COMMON_FP32_TENSOR_H_
#define PSERVER_COMMON_FP32_TENSOR_H_

#include <cstring>

#include "absl/types/span.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

// *t = v as CODEC_FP32 (every other field of *t cleared).
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

}  // namespace pserver

#endif  // PSERVER_COMMON_FP32_TENSOR_H_
