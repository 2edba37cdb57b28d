#include "common/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fused_feedback.h"
#include "common/validated_tensor.h"

namespace pserver {

absl::Status EncodeWithFeedback(const Codec& codec, absl::Span<const float> g,
                                absl::Span<const float> e_in, float decay,
                                uint64_t seed, v1::EncodedTensor* out,
                                absl::Span<float> e_out) {
  if (e_in.size() != g.size() || e_out.size() != g.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "error feedback buffers hold ", e_in.size(), " and ", e_out.size(),
        " elements; expected ", g.size()));
  }
  if (!std::isfinite(decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("decay is ", decay, "; expected a finite value"));
  }
  if (const FusedFeedbackEncoder* fused = codec.fused_feedback()) {
    return fused->EncodeWithFeedback(g, e_in, decay, seed, out, e_out);
  }
  // e_out holds u first, then u - decode(encode(u)).
  for (size_t i = 0; i < g.size(); ++i) {
    float d = decay * e_in[i];
    e_out[i] = g[i] + d;
  }
  absl::Status s = codec.Encode(e_out, seed, out);
  if (!s.ok()) return s;
  // The encoder's own output: decoding it needs no validation.
  ValidatedTensor(&codec, out).AccumulateInto(-1.0f, e_out);
  return absl::OkStatus();
}

ErrorFeedback::ErrorFeedback(const Codec* codec, size_t n, float decay)
    : codec_(codec), decay_(decay), residual_(n, 0.0f), scratch_(n, 0.0f) {}

ErrorFeedback::ErrorFeedback(std::unique_ptr<Codec> codec, size_t n,
                             float decay)
    : owned_(std::move(codec)),
      codec_(owned_.get()),
      decay_(decay),
      residual_(n, 0.0f),
      scratch_(n, 0.0f) {}

absl::Status ErrorFeedback::Encode(absl::Span<const float> g, uint64_t seed,
                                   v1::EncodedTensor* out) {
  if (g.size() != residual_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient has ", g.size(), " elements; expected ", residual_.size()));
  }
  absl::Status s = EncodeWithFeedback(*codec_, g, residual_, decay_, seed,
                                      out, absl::MakeSpan(scratch_));
  if (!s.ok()) return s;
  residual_.swap(scratch_);
  return absl::OkStatus();
}

double ErrorFeedback::ResidualNorm() const {
  double sum = 0;
  for (float v : residual_) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);
}

absl::Status ErrorFeedback::SetResidual(absl::Span<const float> e) {
  if (e.size() != residual_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual has ", e.size(), " elements; expected ", residual_.size()));
  }
  for (size_t i = 0; i < e.size(); ++i) {
    if (!std::isfinite(e[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "residual element ", i, " is not finite; expected finite values"));
    }
  }
  residual_.assign(e.begin(), e.end());
  return absl::OkStatus();
}

void ErrorFeedback::Reset() { std::fill(residual_.begin(), residual_.end(), 0.0f); }

}  // namespace pserver
