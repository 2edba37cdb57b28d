// Error feedback around any codec (Seide et al. 2014; Karimireddy et al.
// 2019): u = g + decay * e; send c = encode(u); keep e = u - decode(c). With
// decay 1 the sum of everything decoded plus the current residual equals the
// sum of every input, so compression error is delayed, never lost.
//
// A wrapper, not part of the codec: any Codec works through its Encode and
// its decoder; a codec with a one-pass kernel (Codec::fused_feedback: onebit,
// topk and block_topk) gets it used here, with bit-identical results.
//
// Usage:
//   ErrorFeedback ef(codec.get(), n);
//   v1::EncodedTensor t;
//   absl::Status s = ef.Encode(gradient, seed, &t);  // residual updated
#ifndef PSERVER_COMMON_ERROR_FEEDBACK_H_
#define PSERVER_COMMON_ERROR_FEEDBACK_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/codec.h"

namespace pserver {

// One error-feedback step for callers that keep the residual themselves
// (double-buffered): u = g + decay * e_in (decay * e_in rounded to fp32
// first); *out = encode(u); e_out = u - decode(*out). Uses the codec's fused
// kernel if it has one. INVALID_ARGUMENT if e_in or e_out is not g.size()
// long, decay is not finite, or some u_i is not finite (naming i); then *out
// and e_out are unspecified and e_in is untouched, so a double-buffering
// caller keeps its state. REQUIRES: e_in and e_out do not overlap.
absl::Status EncodeWithFeedback(const Codec& codec, absl::Span<const float> g,
                                absl::Span<const float> e_in, float decay,
                                uint64_t seed, v1::EncodedTensor* out,
                                absl::Span<float> e_out);

// INVALID_ARGUMENT "<what> element <i> is not finite; expected finite
// values" for the first non-finite element of v, else OK: the check of every
// restored float state (residuals, the worker's momentum).
absl::Status CheckAllFinite(absl::Span<const float> v, absl::string_view what);

// Thread-compatible: one instance per stream; no concurrent calls.
class ErrorFeedback {
 public:
  // References `codec`, which must outlive this object. The residual starts
  // at zero. REQUIRES: decay is finite (typically in [0, 1]).
  ErrorFeedback(const Codec* codec, size_t n, float decay = 1.0f);
  // Owns `codec`.
  ErrorFeedback(std::unique_ptr<Codec> codec, size_t n, float decay = 1.0f);

  ErrorFeedback(const ErrorFeedback&) = delete;
  ErrorFeedback& operator=(const ErrorFeedback&) = delete;

  // *out = encode(g + decay * e); e = that input minus decode(*out).
  // INVALID_ARGUMENT if g.size() != size() or the input is not finite; the
  // residual is then unchanged, byte for byte.
  absl::Status Encode(absl::Span<const float> g, uint64_t seed,
                      v1::EncodedTensor* out);
  // The same for the piece [offset, offset + g.size()) of the stream (one
  // chunk of a push): only that piece of the residual is read and written,
  // in place where the codec's kernel can (1-bit) and the piece's values
  // are bounded so that it cannot refuse, else through a scratch buffer of
  // the piece's size (reused across calls).
  // `bound`, when >= 0, is an upper bound of every |g[i]| that the caller
  // knows from a pass it made anyway (a finite check, the loop that wrote
  // g); the in-place kernel's bound is then taken from it instead of a pass
  // over g. A bound too high only costs the in-place mode; one too low is a
  // caller's error (the in-place kernel could then meet an overflow). +inf
  // (a non-finite input) or a negative value: no bound known.
  absl::Status EncodeAt(uint64_t offset, absl::Span<const float> g,
                        uint64_t seed, v1::EncodedTensor* out,
                        double bound = -1.0);
  // EncodeAt with `codec` instead of codec() (one piece of a chunk whose
  // tensors have codecs of their own: common/tensor_codecs.h).
  absl::Status EncodeAtWith(const Codec& codec, uint64_t offset,
                            absl::Span<const float> g, uint64_t seed,
                            v1::EncodedTensor* out, double bound = -1.0);

  // The residual; empty while it is all zeros and was never needed (a
  // lossless codec such as fp32 never needs one, so it costs no memory).
  absl::Span<const float> residual() const { return residual_; }
  // ||e||_2. Each EncodeAt records its piece's squared norm, so this is a
  // sum over the pieces (no pass over the residual) once the pieces cover
  // it; otherwise a pass in double. A piece's norm is summed in double, or
  // by an in-place kernel in float lanes per block: then within ~1e-7 of
  // the double sum for blocks of 256 (the default), ~1e-5 for blocks as
  // long as a chunk.
  double ResidualNorm() const;
  // For checkpoints (empty: all zeros). INVALID_ARGUMENT on a size mismatch
  // or non-finite values, leaving the residual unchanged.
  absl::Status SetResidual(absl::Span<const float> e);
  void Reset();  // e = 0

  size_t size() const { return size_; }
  float decay() const { return decay_; }
  const Codec& codec() const { return *codec_; }
  // Encodes with `codec` from now on (nullptr: the one it was built with);
  // the residual carries over, so what the old codec dropped is sent by the
  // new one. `codec` must outlive its use here.
  void UseCodec(const Codec* codec) {
    codec_ = codec != nullptr ? codec : built_with_;
  }

 private:
  std::unique_ptr<Codec> owned_;
  const Codec* built_with_;
  const Codec* codec_;
  float decay_;
  size_t size_;
  std::vector<float> residual_;  // empty: all zeros
  std::vector<float> scratch_;   // the piece's next residual
  // Squared norm of each piece's residual, by offset: (size, sum of e^2).
  std::map<uint64_t, std::pair<uint64_t, double>> piece_sq_;
};

}  // namespace pserver

#endif  // PSERVER_COMMON_ERROR_FEEDBACK_H_
