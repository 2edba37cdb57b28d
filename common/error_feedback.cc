#include "common/error_feedback.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {

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
  absl::Status s = codec_->EncodeWithFeedback(g, residual_, decay_, seed, out,
                                              absl::MakeSpan(scratch_));
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
