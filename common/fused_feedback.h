// An optional capability of a codec: error feedback in one pass over memory
// instead of the three of the generic algorithm (form u, encode, subtract the
// decode). A codec offers it through Codec::fused_feedback(); ErrorFeedback
// (common/error_feedback.h) is the only intended caller: it checks the
// arguments and falls back to the generic algorithm for codecs without one.
#ifndef PSERVER_COMMON_FUSED_FEEDBACK_H_
#define PSERVER_COMMON_FUSED_FEEDBACK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

// Thread safety: implementations are thread-safe (immutable, or with
// internally locked workspaces); calls may run concurrently.
class FusedFeedbackEncoder {
 public:
  virtual ~FusedFeedbackEncoder() = default;

  // u = g + decay * e_in (the product rounded to fp32 before the sum);
  // *out = encode(u); e_out = u - decode(*out). Output and e_out must be bit
  // for bit those of the generic algorithm in error_feedback.cc.
  // REQUIRES: g, e_in and e_out have the same size; e_in and e_out do not
  // overlap; decay is finite. On error (INVALID_ARGUMENT naming the first
  // non-finite u_i) *out and e_out are unspecified and e_in is untouched.
  virtual absl::Status EncodeWithFeedback(absl::Span<const float> g,
                                          absl::Span<const float> e_in,
                                          float decay, uint64_t seed,
                                          v1::EncodedTensor* out,
                                          absl::Span<float> e_out) const = 0;

  // Whether EncodeWithFeedbackInPlace is implemented.
  virtual bool in_place() const { return false; }
  // The same with e_in and e_out one buffer e, updated in place, and
  // *e_sq = the sum of the squares of the new e (double; in an order of
  // the kernel's own). Nothing to copy back, no second buffer. But a
  // refused call leaves e partly updated: callers use it only where every
  // u is known to be finite (ErrorFeedback checks bounds first).
  // UNIMPLEMENTED unless in_place().
  virtual absl::Status EncodeWithFeedbackInPlace(
      absl::Span<const float> /*g*/, absl::Span<float> /*e*/, float /*decay*/,
      uint64_t /*seed*/, v1::EncodedTensor* /*out*/,
      double* /*e_sq*/) const {
    return absl::UnimplementedError("no in-place error-feedback kernel");
  }
};

}  // namespace pserver

#endif  // PSERVER_COMMON_FUSED_FEEDBACK_H_
