// Adam in double, the reference the optimizer tests compare against:
// DeepSpeed's conventions (no bias correction unless asked, eps outside the
// sqrt) and AdamW's decoupled weight decay; with `bias` it is
// torch.optim.AdamW.
#ifndef PSERVER_TESTS_SERVER_REF_ADAM_H_
#define PSERVER_TESTS_SERVER_REF_ADAM_H_

#include <cmath>
#include <vector>

#include "absl/types/span.h"

namespace pserver {
namespace testing_util {

struct RefAdam {
  std::vector<double> x, m, v;
  double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0;
  bool bias = false;
  int t = 0;

  // Weights x0, zero moments.
  static RefAdam At(absl::Span<const float> x0) {
    RefAdam r;
    r.x.assign(x0.begin(), x0.end());
    r.m.assign(x0.size(), 0);
    r.v.assign(x0.size(), 0);
    return r;
  }

  // One step on g (g.size() >= x.size(); its first x.size() elements).
  void Step(absl::Span<const float> g) {
    ++t;
    for (size_t i = 0; i < x.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * double{g[i]} * g[i];
      double mh = bias ? m[i] / (1 - std::pow(b1, t)) : m[i];
      double vh = bias ? v[i] / (1 - std::pow(b2, t)) : v[i];
      x[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * x[i]);
    }
  }
};

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_SERVER_REF_ADAM_H_
