// The codec interface: a span of fp32 values to a pserver.v1.EncodedTensor and
// back. One algorithm per file under common/impl/; MakeCodec builds an
// encoder, DecoderFor looks up the shared decoder of a codec id. Untrusted
// tensors go through ValidateTensor (common/validated_tensor.h); error
// feedback wraps any codec (common/error_feedback.h).
//
// Values on the wire are always finite: Encode refuses NaN/Inf input with
// INVALID_ARGUMENT naming the first bad index, and decoders refuse payloads
// whose values or scales are not finite. Decoders treat the EncodedTensor as
// untrusted input: they validate it completely before touching the output,
// so a rejected tensor leaves the output byte-for-byte unchanged.
#ifndef PSERVER_COMMON_CODEC_H_
#define PSERVER_COMMON_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

class FusedFeedbackEncoder;  // common/fused_feedback.h
namespace impl {
class SegmentsCodec;  // common/impl/segments.cc
}
class ValidatedTensor;       // common/validated_tensor.h

// Encodes, validates and decodes one codec. Decoding reads the layout
// (block_size, value_format, bits, k, seed, ...) from the tensor's own params,
// never from the codec's configuration, so one decoder per codec id serves
// every tensor of that id.
//
// Thread safety: a Codec is immutable after construction; all methods are
// const and may be called concurrently.
class Codec {
 public:
  virtual ~Codec() = default;

  virtual v1::Codec id() const = 0;
  // The parameters this codec encodes with (defaults filled in).
  virtual const v1::CodecParams& params() const = 0;

  // Encodes u into *out (codec, num_elements, params, payload), replacing
  // what *out held. `seed` feeds stochastic rounding and randomk's index set;
  // pass a different one each call (e.g. from worker, step and shard).
  // Returns INVALID_ARGUMENT for non-finite input, leaving *out unspecified.
  virtual absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                              v1::EncodedTensor* out) const = 0;

  // Checks that t is a well-formed tensor of this codec with exactly
  // `num_elements` elements: everything the decoder reads. Does not read any
  // output. ValidateTensor adds the range check of every params field.
  virtual absl::Status Validate(const v1::EncodedTensor& t,
                                uint64_t num_elements) const = 0;

  // acc += alpha * decode(t). Validates first: on error acc is unchanged.
  // REQUIRES: acc.size() is the number of elements t should hold.
  virtual absl::Status DecodeAccumulate(const v1::EncodedTensor& t,
                                        float alpha,
                                        absl::Span<float> acc) const = 0;

  // out = decode(t) (overwrites). Validates first: on error out is unchanged.
  absl::Status Decode(const v1::EncodedTensor& t, absl::Span<float> out) const;

  // The codec's one-pass error-feedback kernel, or nullptr if it has none
  // (ErrorFeedback then runs Encode and the decoder). Lives as long as this.
  virtual const FusedFeedbackEncoder* fused_feedback() const {
    return nullptr;
  }

 protected:
  // acc += alpha * decode(t), without checks. REQUIRES: Validate(t,
  // acc.size()) is OK, or t is this codec's own unmodified output.
  virtual void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                               absl::Span<float> acc) const = 0;
  // out = base + decode(t) without checks, bit for bit a copy of base then
  // AccumulateValid(t, 1, out). base and out have the same size and are
  // the same span or do not overlap. The default is that copy and
  // accumulate; codecs override it with one pass (a pulled delta applied
  // to the replica reads and writes the model once instead of twice).
  virtual void AddValid(const v1::EncodedTensor& t,
                        absl::Span<const float> base,
                        absl::Span<float> out) const;
  // out = 0.0f + alpha * decode(t) without checks, bit for bit a zero-filled
  // out then AccumulateValid(t, alpha, out) (what it overwrites is not
  // read). The default is that fill and accumulate; codecs override it
  // with one pass that writes out once (the shard's first push of a chunk
  // in a round, a decoded snapshot).
  virtual void AssignValid(const v1::EncodedTensor& t, float alpha,
                           absl::Span<float> out) const;

 private:
  // Runs AccumulateValid on tensors it has validated (or that the encoder
  // itself produced), so that validation happens once.
  friend class ValidatedTensor;
  // Decodes its segments, which it validated, with their own decoders.
  friend class impl::SegmentsCodec;
};

// Builds the codec `codec` with `params`; unset fields get their defaults
// (block 256, or 16 for block_topk; k_fraction 0.01, bits 8, percentile 99,
// fp32 values).
// INVALID_ARGUMENT names the parameter that is out of range.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(v1::Codec codec,
                                                 const v1::CodecParams& params);

// The decoder of codec id `codec` (CODEC_SEGMENTS and CODEC_UNCHANGED
// included, which only decode): one immutable instance per id, built on
// first use and alive until the process exits (never destroyed), so it can be
// kept as a plain pointer and shared by threads. nullptr for an id that is not
// a known codec (CODEC_UNSPECIFIED included). The instance carries default
// params; it is meant for decoding (Validate, DecodeAccumulate, Decode).
// Untrusted tensors: prefer ValidateTensor, which also range-checks params.
const Codec* DecoderFor(v1::Codec codec);
// As DecoderFor, but INVALID_ARGUMENT "codec is N; expected one of fp32, ..."
// for an unknown id.
absl::StatusOr<const Codec*> FindDecoder(v1::Codec codec);

// DEPRECATED: allocates a codec per call; use ValidateTensor (untrusted
// input) or DecoderFor / FindDecoder. Builds the codec a received tensor says
// it was encoded with. INVALID_ARGUMENT for an unknown codec or bad params.
absl::StatusOr<std::unique_ptr<Codec>> MakeDecoderFor(
    const v1::EncodedTensor& t);

// Parses "fp32", "fp16", "bf16", "onebit", "topk", "randomk", "quantize",
// "topk_quantize", "block_topk" (case-insensitive).
absl::StatusOr<v1::Codec> ParseCodecName(absl::string_view name);
std::string CodecName(v1::Codec codec);
// Every codec ParseCodecName accepts, in the order above.
std::vector<v1::Codec> NamedCodecs();

// The payload bytes t puts on the wire: its payload, or for CODEC_SEGMENTS
// its segments' payloads.
inline uint64_t PayloadBytes(const v1::EncodedTensor& t) {
  uint64_t bytes = t.payload().size();
  for (const v1::EncodedTensor& s : t.segments()) bytes += s.payload().size();
  return bytes;
}

// Payload bytes an fp32 encoding of n elements would take (the baseline for
// compression ratios).
inline uint64_t Fp32Bytes(uint64_t n) { return n * 4; }

}  // namespace pserver

#endif  // PSERVER_COMMON_CODEC_H_
