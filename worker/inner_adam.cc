#include "worker/inner_adam.h"

#include <cmath>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"

namespace pserver {

absl::Status InnerAdam::Validate(const InnerAdamOptions& o) {
  auto bad = [](const char* name, float v, const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is ", v, "; expected ", want));
  };
  if (!(o.lr > 0 && std::isfinite(o.lr))) return bad("inner_lr", o.lr, "> 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return bad("inner beta1", o.beta1, "[0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return bad("inner beta2", o.beta2, "[0, 1)");
  if (!(o.eps > 0 && std::isfinite(o.eps))) return bad("inner eps", o.eps, "> 0");
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay))) {
    return bad("inner_weight_decay", o.weight_decay, ">= 0");
  }
  return absl::OkStatus();
}

InnerAdam::InnerAdam(const InnerAdamOptions& o, size_t n)
    : o_(o), m_(n, 0.0f), v_(n, 0.0f) {}

void InnerAdam::Step(absl::Span<const float> g, absl::Span<float> x) {
  ABSL_RAW_CHECK(g.size() == m_.size() && x.size() == m_.size(),
                 "InnerAdam::Step: size mismatch");
  ++t_;
  const double t = static_cast<double>(t_);
  const float mc = static_cast<float>(1.0 / (1.0 - std::pow(double{o_.beta1}, t)));
  const float vc = static_cast<float>(1.0 / (1.0 - std::pow(double{o_.beta2}, t)));
  const float b1 = o_.beta1, b2 = o_.beta2, lr = o_.lr, eps = o_.eps;
  const float wd = o_.weight_decay;
  float* m = m_.data();
  float* v = v_.data();
  for (size_t i = 0; i < m_.size(); ++i) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    x[i] -= lr * ((m[i] * mc) / (std::sqrt(v[i] * vc) + eps) + wd * x[i]);
  }
}

}  // namespace pserver
