// InnerAdam (worker/inner_adam.h), the local optimizer of local-step
// training, against a double-precision AdamW written out here.
#include "worker/inner_adam.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pserver {
namespace {

TEST(InnerAdam, EqualsADoubleReferenceAdamW) {
  InnerAdamOptions o;
  o.lr = 0.01f;
  o.weight_decay = 0.1f;
  const size_t n = 5;
  InnerAdam adam(o, n);
  std::vector<float> x = {1.0f, -0.5f, 0.0f, 2.0f, -3.0f};
  std::vector<double> rx(x.begin(), x.end()), m(n, 0), v(n, 0);
  for (int t = 1; t <= 20; ++t) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) {
      g[i] = static_cast<float>(std::sin(0.7 * t + i) * (i + 1));
    }
    adam.Step(g, absl::MakeSpan(x));
    for (size_t i = 0; i < n; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * double{g[i]} * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, t));
      const double vh = v[i] / (1 - std::pow(0.999, t));
      rx[i] -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * rx[i]);
    }
  }
  EXPECT_EQ(adam.steps(), 20u);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], rx[i], 1e-5) << i;
}

TEST(InnerAdam, ValidateNamesTheOption) {
  InnerAdamOptions o;
  EXPECT_TRUE(InnerAdam::Validate(o).ok());
  o.lr = -1;
  absl::Status s = InnerAdam::Validate(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inner_lr is -1; expected > 0"),
            std::string::npos) << s;
  o.lr = 1e-3f;
  o.beta2 = 1.0f;
  EXPECT_NE(InnerAdam::Validate(o).message().find("inner beta2"),
            std::string::npos);
}

}  // namespace
}  // namespace pserver
