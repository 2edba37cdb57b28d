#include "worker/preconditioner.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

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

absl::Span<const float> Preconditioner::Apply(absl::Span<const float> g,
                                              size_t offset) {
  if (scratch_.size() < g.size()) scratch_.resize(g.size());
  const float* d = d_.data() + offset;
  for (size_t i = 0; i < g.size(); ++i) scratch_[i] = d[i] * g[i];
  return absl::MakeConstSpan(scratch_).subspan(0, g.size());
}

void Preconditioner::ScaleInPlace(absl::Span<float> v) const {
  for (size_t i = 0; i < v.size(); ++i) v[i] *= d_[i];
}

}  // namespace pserver
