// A received tensor that has passed every check its decoder needs, as a type:
// code that holds a ValidatedTensor decodes without re-checking, and code that
// needs one cannot skip the validation by accident.
//
// Usage (the shard, per push):
//   absl::StatusOr<ValidatedTensor> v = ValidateTensor(req.gradient(), n);
//   if (!v.ok()) return v.status();  // INVALID_ARGUMENT naming the field
//   v->AccumulateInto(1.0f, absl::MakeSpan(sum));  // no allocation, no check
#ifndef PSERVER_COMMON_VALIDATED_TENSOR_H_
#define PSERVER_COMMON_VALIDATED_TENSOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

// Made only by ValidateTensor (and, for its own output, by error feedback).
// It is two pointers: the tensor and the process-lifetime decoder of its
// codec (DecoderFor), so it is cheap to copy.
//
// Lifetime: the token references the tensor it was made from, which must
// outlive the token and stay unmodified while the token is used (for example
// keep the request that holds it alive; do not mutate or move from it).
//
// Thread safety: immutable; const methods may run concurrently (each call
// writes only the span it is given).
class ValidatedTensor {
 public:
  const v1::EncodedTensor& tensor() const { return *tensor_; }
  v1::Codec codec() const { return tensor_->codec(); }
  uint64_t num_elements() const { return tensor_->num_elements(); }

  // acc += alpha * decode(tensor()), without re-validating, bit for bit what
  // Codec::DecodeAccumulate gives.
  // REQUIRES: acc.size() == num_elements() (checked: aborts otherwise, as a
  // wrong size is a programmer error that would write out of bounds).
  void AccumulateInto(float alpha, absl::Span<float> acc) const;

  // out = base + decode(tensor()), bit for bit a copy of base followed by
  // AccumulateInto(1, out), in one pass where the codec has one. base and
  // out are the same span or do not overlap.
  // REQUIRES: base.size() == out.size() == num_elements() (checked as
  // below).
  void AddInto(absl::Span<const float> base, absl::Span<float> out) const;
  // out = 0.0f + alpha * decode(tensor()) (overwrites, without reading
  // out), bit for bit a zero-filled out followed by AccumulateInto(alpha,
  // out), in one pass where the codec has one.
  // REQUIRES: out.size() == num_elements() (checked as above).
  void AssignInto(float alpha, absl::Span<float> out) const;
  // out = decode(tensor()) (overwrites), bit for bit Codec::Decode.
  // REQUIRES: out.size() == num_elements() (checked as above).
  void DecodeInto(absl::Span<float> out) const;

  // *copy = tensor(), and a token for the copy: a byte-for-byte copy is as
  // valid as what was checked, so it need not be checked again. The copy's
  // lifetime rules are the token's.
  ValidatedTensor CopyInto(v1::EncodedTensor* copy) const {
    *copy = *tensor_;
    return ValidatedTensor(decoder_, copy);
  }

 private:
  friend absl::StatusOr<ValidatedTensor> ValidateTensor(
      const v1::EncodedTensor& t, uint64_t num_elements);
  // The generic error-feedback path decodes the encoder's own output.
  friend absl::Status EncodeWithFeedback(const Codec& codec,
                                         absl::Span<const float> g,
                                         absl::Span<const float> e_in,
                                         float decay, uint64_t seed,
                                         v1::EncodedTensor* out,
                                         absl::Span<float> e_out);

  ValidatedTensor(const Codec* decoder, const v1::EncodedTensor* tensor)
      : decoder_(decoder), tensor_(tensor) {}

  void CheckSize(size_t size) const;

  const Codec* decoder_;
  const v1::EncodedTensor* tensor_;
};

// Checks an untrusted tensor completely: its codec id is known, every params
// field is in range (whatever the codec), and the payload is exactly what its
// decoder reads for `num_elements` elements (sizes, indices, finite values).
// INVALID_ARGUMENT otherwise, with the message MakeDecoderFor + Validate gave:
// "codec is 42; expected one of fp32, ...", "params.bits is 9; expected
// 2..8", "num_elements is 999; expected 1000", ...
// Never allocates in proportion to the claimed sizes.
// The token references `t`: see ValidatedTensor.
absl::StatusOr<ValidatedTensor> ValidateTensor(const v1::EncodedTensor& t,
                                               uint64_t num_elements);
// A token for a temporary would dangle at once.
absl::StatusOr<ValidatedTensor> ValidateTensor(v1::EncodedTensor&& t,
                                               uint64_t num_elements) = delete;

}  // namespace pserver

#endif  // PSERVER_COMMON_VALIDATED_TENSOR_H_
