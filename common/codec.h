// The codec interface: a span of fp32 values to a pserver.v1.EncodedTensor and
// back. One algorithm per file under common/impl/; MakeCodec picks one.
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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

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
  // `num_elements` elements. Does not read any output.
  virtual absl::Status Validate(const v1::EncodedTensor& t,
                                uint64_t num_elements) const = 0;

  // acc += alpha * decode(t). Validates first: on error acc is unchanged.
  // REQUIRES: acc.size() is the number of elements t should hold.
  virtual absl::Status DecodeAccumulate(const v1::EncodedTensor& t,
                                        float alpha,
                                        absl::Span<float> acc) const = 0;

  // Fused error feedback (Seide et al. 2014; Karimireddy et al. 2019):
  // u = g + decay * e_in; *out = encode(u); e_out = u - decode(*out).
  // e_in and e_out may not alias. On error e_out is unspecified and e_in
  // untouched, so callers that double-buffer keep their state.
  // The default runs Encode and DecodeAccumulate; codecs override it with a
  // one-pass kernel.
  virtual absl::Status EncodeWithFeedback(absl::Span<const float> g,
                                          absl::Span<const float> e_in,
                                          float decay, uint64_t seed,
                                          v1::EncodedTensor* out,
                                          absl::Span<float> e_out) const;

  // out = decode(t) (overwrites). Validates first: on error out is unchanged.
  absl::Status Decode(const v1::EncodedTensor& t, absl::Span<float> out) const;

 protected:
  // acc += alpha * decode(t), without checks. REQUIRES: Validate(t,
  // acc.size()) is OK. Lets Decode and the default EncodeWithFeedback
  // validate once (or not at all, for the encoder's own output).
  virtual void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                               absl::Span<float> acc) const = 0;
};

// Builds the codec `codec` with `params`; unset fields get their defaults
// (block 256, k_fraction 0.01, bits 8, percentile 99, fp32 values).
// INVALID_ARGUMENT names the parameter that is out of range.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(v1::Codec codec,
                                                 const v1::CodecParams& params);

// Builds the codec a received tensor says it was encoded with, for decoding
// untrusted input. INVALID_ARGUMENT for an unknown codec or bad parameters.
absl::StatusOr<std::unique_ptr<Codec>> MakeDecoderFor(
    const v1::EncodedTensor& t);

// Parses "fp32", "fp16", "bf16", "onebit", "topk", "randomk", "quantize",
// "topk_quantize" (case-insensitive).
absl::StatusOr<v1::Codec> ParseCodecName(absl::string_view name);
std::string CodecName(v1::Codec codec);

// Payload bytes an fp32 encoding of n elements would take (the baseline for
// compression ratios).
inline uint64_t Fp32Bytes(uint64_t n) { return n * 4; }

}  // namespace pserver

#endif  // PSERVER_COMMON_CODEC_H_
