#include "server/model_install.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/rejection.h"
#include "common/validated_tensor.h"

namespace pserver {

ModelInstall::ModelInstall(uint32_t installer, const v1::ModelLayout& layout,
                           std::vector<TensorSlot> slots, ChunkPlan plan,
                           absl::Time now)
    : installer_(installer),
      layout_(layout),
      slots_(std::move(slots)),
      plan_(plan),
      x_(plan.n, 0.0f),
      in_(plan.num_chunks(), false),
      last_call_(now) {}

absl::Status ModelInstall::Accept(uint32_t c, const v1::EncodedTensor& weights) {
  if (c >= plan_.num_chunks()) {
    return Reject(v1::REJECT_REASON_INVALID_FIELD,
                  absl::InvalidArgumentError(absl::StrCat(
                      "weights_chunk is ", c, "; expected 0..",
                      plan_.num_chunks() - 1, " (the slice's ", plan_.n,
                      " elements in chunks of ", plan_.chunk_elements, ")")));
  }
  if (weights.codec() != v1::CODEC_FP32) {
    return Reject(v1::REJECT_REASON_INVALID_PAYLOAD,
                  absl::InvalidArgumentError(absl::StrCat(
                      "initial_weights.codec is ", CodecName(weights.codec()),
                      "; expected fp32 (CODEC_FP32)")));
  }
  const uint64_t n = plan_.size(c);
  if (weights.num_elements() != n || weights.payload().size() != Fp32Bytes(n)) {
    return Reject(v1::REJECT_REASON_WRONG_SIZE,
                  absl::InvalidArgumentError(absl::StrCat(
                      "initial_weights holds ", weights.num_elements(),
                      " elements in ", weights.payload().size(),
                      " bytes; expected ", n, " elements in ", Fp32Bytes(n),
                      " bytes (chunk ", c, " of this shard's slice)")));
  }
  absl::StatusOr<ValidatedTensor> valid = ValidateTensor(weights, n);
  if (!valid.ok()) {
    return Reject(v1::REJECT_REASON_INVALID_PAYLOAD,
                  absl::InvalidArgumentError(absl::StrCat(
                      "initial_weights (chunk ", c, "): ",
                      valid.status().message())));
  }
  if (in_[c]) return absl::OkStatus();
  valid->DecodeInto(absl::MakeSpan(x_).subspan(plan_.begin(c), n));
  in_[c] = true;
  ++chunks_in_;
  return absl::OkStatus();
}

}  // namespace pserver
