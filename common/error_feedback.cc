#include "common/error_feedback.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fused_feedback.h"
#include "common/norms.h"
#include "common/validated_tensor.h"

namespace pserver {
namespace {

// sum v_i^2 in double, four independent sums (a serial sum would wait on
// each add).
double SquaredNorm(absl::Span<const float> v) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= v.size(); i += 4) {
    a0 += static_cast<double>(v[i]) * v[i];
    a1 += static_cast<double>(v[i + 1]) * v[i + 1];
    a2 += static_cast<double>(v[i + 2]) * v[i + 2];
    a3 += static_cast<double>(v[i + 3]) * v[i + 3];
  }
  for (; i < v.size(); ++i) a0 += static_cast<double>(v[i]) * v[i];
  return (a0 + a1) + (a2 + a3);
}

// dst = src and SquaredNorm(src) in one pass over src (the residual of a
// large model is read once per step instead of twice).
double CopyWithSquaredNorm(absl::Span<const float> src, absl::Span<float> dst) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= src.size(); i += 4) {
    const float v0 = src[i], v1 = src[i + 1], v2 = src[i + 2], v3 = src[i + 3];
    dst[i] = v0;
    dst[i + 1] = v1;
    dst[i + 2] = v2;
    dst[i + 3] = v3;
    a0 += static_cast<double>(v0) * v0;
    a1 += static_cast<double>(v1) * v1;
    a2 += static_cast<double>(v2) * v2;
    a3 += static_cast<double>(v3) * v3;
  }
  for (; i < src.size(); ++i) {
    dst[i] = src[i];
    a0 += static_cast<double>(src[i]) * src[i];
  }
  return (a0 + a1) + (a2 + a3);
}

// Where the in-place kernel may run: |u| at most a quarter of FLT_MAX, so
// that u - decode(u) (|decode(u)| <= max |u|) is finite too.
constexpr double kInPlaceBound = 0.25 * FLT_MAX;

}  // namespace

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
    : built_with_(codec), codec_(codec), decay_(decay), size_(n) {}

ErrorFeedback::ErrorFeedback(std::unique_ptr<Codec> codec, size_t n,
                             float decay)
    : owned_(std::move(codec)),
      built_with_(owned_.get()),
      codec_(owned_.get()),
      decay_(decay),
      size_(n) {}

absl::Status ErrorFeedback::Encode(absl::Span<const float> g, uint64_t seed,
                                   v1::EncodedTensor* out) {
  if (g.size() != size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient has ", g.size(), " elements; expected ", size_));
  }
  return EncodeAt(0, g, seed, out);
}

absl::Status ErrorFeedback::EncodeAt(uint64_t offset, absl::Span<const float> g,
                                     uint64_t seed, v1::EncodedTensor* out,
                                     double bound) {
  return EncodeAtWith(*codec_, offset, g, seed, out, bound);
}

absl::Status ErrorFeedback::EncodeAtWith(const Codec& codec, uint64_t offset,
                                         absl::Span<const float> g,
                                         uint64_t seed,
                                         v1::EncodedTensor* out,
                                         double bound) {
  if (offset > size_ || g.size() > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "piece [", offset, ", ", offset + g.size(), ") is outside the ",
        size_, " elements of the residual"));
  }
  if (residual_.empty() && codec.id() == v1::CODEC_FP32) {
    // Lossless: u = g and u - decode(encode(u)) = 0, so the residual stays
    // all zeros and is never allocated. Encode refuses non-finite input.
    return codec.Encode(g, seed, out);
  }
  const bool fresh = residual_.empty();
  if (fresh) residual_.assign(size_, 0.0f);
  absl::Span<float> e = absl::MakeSpan(residual_).subspan(offset, g.size());
  auto it = piece_sq_.find(offset);
  const bool known = it != piece_sq_.end() && it->second.first == g.size();
  double next_sq = 0;
  // In place when the kernel has that mode and cannot refuse: every
  // |u| = |g + decay e| <= max|g| + |decay| ||e|| must stay far from
  // FLT_MAX (so u and u - decode(u) are finite). A refusal in place would
  // leave the piece half updated, so the bound is checked first; the
  // residual's norm is the piece's, recorded last time. That saves the
  // scratch buffer and the copy back (a read and a write of the piece).
  const FusedFeedbackEncoder* fused = codec.fused_feedback();
  if (fused != nullptr && fused->in_place() && (fresh || known) &&
      std::isfinite(decay_) &&
      (bound >= 0.0 ? bound : MaxAbs(g)) +
              std::fabs(double{decay_}) *
                  (fresh ? 0.0 : std::sqrt(it->second.second)) <=
          kInPlaceBound) {
    absl::Status s =
        fused->EncodeWithFeedbackInPlace(g, e, decay_, seed, out, &next_sq);
    if (!s.ok()) return s;  // unreachable under the bound
    // The kernel sums squares in float lanes: past ~1e19 an element's
    // square is not finite there. Then in double.
    if (!std::isfinite(next_sq)) next_sq = SquaredNorm(e);
  } else {
    if (scratch_.size() < g.size()) scratch_.resize(g.size());
    absl::Span<float> next = absl::MakeSpan(scratch_).subspan(0, g.size());
    absl::Status s = EncodeWithFeedback(codec, g, e, decay_, seed, out, next);
    if (!s.ok()) return s;
    next_sq = CopyWithSquaredNorm(next, e);
  }
  // Record the piece's squared norm; pieces cut differently before (another
  // chunking) are forgotten.
  if (it == piece_sq_.end() || it->second.first != g.size()) {
    const uint64_t end = offset + g.size();
    auto first = piece_sq_.lower_bound(offset);
    if (first != piece_sq_.begin()) {
      auto prev = std::prev(first);
      if (prev->first + prev->second.first > offset) first = prev;
    }
    auto last = piece_sq_.lower_bound(end);
    piece_sq_.erase(first, last);
    it = piece_sq_.emplace(offset, std::make_pair(g.size(), 0.0)).first;
  }
  it->second.second = next_sq;
  return absl::OkStatus();
}

double ErrorFeedback::ResidualNorm() const {
  if (residual_.empty()) return 0.0;
  double sum = 0;
  uint64_t covered = 0;
  for (const auto& [offset, piece] : piece_sq_) {
    if (offset != covered) break;
    covered += piece.first;
    sum += piece.second;
  }
  if (covered != size_) sum = SquaredNorm(residual_);
  return std::sqrt(sum);
}

absl::Status CheckAllFinite(absl::Span<const float> v, absl::string_view what) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " element ", i, " is not finite; expected finite values"));
    }
  }
  return absl::OkStatus();
}

absl::Status ErrorFeedback::SetResidual(absl::Span<const float> e) {
  if (e.empty()) {
    Reset();
    return absl::OkStatus();
  }
  if (e.size() != size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual has ", e.size(), " elements; expected ", size_));
  }
  if (absl::Status s = CheckAllFinite(e, "residual"); !s.ok()) return s;
  residual_.assign(e.begin(), e.end());
  piece_sq_.clear();
  return absl::OkStatus();
}

void ErrorFeedback::Reset() {
  piece_sq_.clear();
  residual_.clear();
  residual_.shrink_to_fit();
}

}  // namespace pserver
