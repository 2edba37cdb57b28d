#include "worker/preconditioner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/internal/cpu.h"
#include "common/norms.h"

namespace pserver {

absl::StatusOr<Preconditioner> Preconditioner::FromVariance(
    std::vector<float> v, float eps) {
  for (size_t i = 0; i < v.size(); ++i) {
    const float d = 1.0f / (std::sqrt(v[i]) + eps);
    if (!std::isfinite(d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frozen variance element ", i, " is ", v[i], " with eps ", eps,
          "; expected v >= 0 and sqrt(v) + eps > 0"));
    }
    v[i] = d;
  }
  Preconditioner p;
  p.d_ = std::move(v);
  return p;
}

namespace {

// out = d ⊙ g; returns the largest AbsBits of out.
PSERVER_CLONES_AVX2 uint32_t ScaleTaking(const float* __restrict d,
                                         const float* __restrict g,
                                         float* __restrict out, size_t n) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = d[i] * g[i];
    top = std::max(top, AbsBits(out[i]));
  }
  return top;
}

}  // namespace

absl::Span<const float> Preconditioner::Apply(absl::Span<const float> g,
                                              size_t offset, double* max_abs) {
  if (scratch_.size() < g.size()) scratch_.resize(g.size());
  const uint32_t top =
      ScaleTaking(d_.data() + offset, g.data(), scratch_.data(), g.size());
  if (max_abs != nullptr) *max_abs = MaxAbsOfBits(top);
  return absl::MakeConstSpan(scratch_).subspan(0, g.size());
}

void Preconditioner::ScaleInPlace(absl::Span<float> v) const {
  for (size_t i = 0; i < v.size(); ++i) v[i] *= d_[i];
}

}  // namespace pserver
