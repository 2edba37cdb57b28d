#include "server/optimizer.h"
#include "server/moment_optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/ref_adam.h"

namespace pserver {
namespace {

// Deterministic pseudo-random gradients.
std::vector<float> Gradient(uint64_t n, uint64_t step, float scale = 1.0f) {
  std::vector<float> g(n);
  uint64_t z = 0x9E3779B97F4A7C15ULL * (step + 1);
  for (uint64_t i = 0; i < n; ++i) {
    z ^= z << 13;
    z ^= z >> 7;
    z ^= z << 17;
    g[i] = scale * (static_cast<float>(z >> 40) / (1 << 24) - 0.5f);
  }
  // A few coordinates that never get gradient (dead ReLUs).
  for (uint64_t i = 0; i < n; i += 37) g[i] = 0.0f;
  return g;
}

std::vector<float> Weights(uint64_t n) {
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) x[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  return x;
}

using testing_util::RefAdam;

RefAdam MakeRef(const OptimizerConfig& c, const std::vector<float>& x0) {
  RefAdam r = RefAdam::At(x0);
  r.lr = c.lr;
  r.b1 = c.beta1;
  r.b2 = c.beta2;
  r.eps = c.eps;
  r.wd = c.weight_decay;
  r.bias = c.bias_correction;
  return r;
}

// Steps `a` on xa and `b` on xb with the same gradients, rounds [from, to).
void StepBoth(MomentOptimizer& a, std::vector<float>& xa, MomentOptimizer& b,
              std::vector<float>& xb, int from, int to) {
  for (int t = from; t < to; ++t) {
    std::vector<float> g = Gradient(xa.size(), t, 0.1f);
    a.Step(g, absl::MakeSpan(xa));
    b.Step(g, absl::MakeSpan(xb));
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                 double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = rel * std::max(1.0, std::fabs(want[i]));
    ASSERT_NEAR(got[i], want[i], tol) << "at " << i;
  }
}

TEST(Optimizer, OneBitAdamBeforeFreezeEqualsDoubleReferenceAdam) {
  const uint64_t n = 3000;
  OptimizerConfig c;
  c.kind = OptimizerKind::kOneBitAdam;
  c.freeze_step = 1000;  // beyond the run
  c.weight_decay = 0.01f;
  MomentOptimizer opt(c, n, {{0, 1000}, {1000, n}});
  std::vector<float> x = Weights(n);
  RefAdam ref = MakeRef(c, x);
  for (int t = 0; t < 200; ++t) {
    std::vector<float> g = Gradient(n, t, 0.1f);
    opt.Step(g, absl::MakeSpan(x));
    ref.Step(g);
  }
  EXPECT_EQ(opt.stage(), v1::OPTIMIZER_STAGE_WARMUP);
  ExpectClose(x, ref.x, 1e-6);
}

TEST(Optimizer, AdamWithBiasCorrectionEqualsReference) {
  const uint64_t n = 1000;
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.bias_correction = true;
  MomentOptimizer opt(c, n, {{0, n}});
  std::vector<float> x = Weights(n);
  RefAdam ref = MakeRef(c, x);
  for (int t = 0; t < 100; ++t) {
    std::vector<float> g = Gradient(n, t);
    opt.Step(g, absl::MakeSpan(x));
    ref.Step(g);
  }
  ExpectClose(x, ref.x, 1e-6);
}

TEST(Optimizer, VarianceIsBitwiseConstantAfterFreeze) {
  const uint64_t n = 2000;
  OptimizerConfig c;
  c.freeze_step = 10;
  MomentOptimizer opt(c, n, {{0, 500}, {500, n}});
  std::vector<float> x = Weights(n);
  for (int t = 0; t < 10; ++t) opt.Step(Gradient(n, t), absl::MakeSpan(x));
  ASSERT_TRUE(opt.frozen());
  EXPECT_EQ(opt.stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  EXPECT_EQ(opt.expected_space(), v1::GRADIENT_SPACE_PRECONDITIONED);
  std::vector<float> v0(opt.v().begin(), opt.v().end());
  for (int t = 10; t < 50; ++t) opt.Step(Gradient(n, t), absl::MakeSpan(x));
  std::vector<float> v1(opt.v().begin(), opt.v().end());
  EXPECT_EQ(0, std::memcmp(v0.data(), v1.data(), n * sizeof(float)));
}

TEST(Optimizer, FreezeFloorsSqrtVariancePerTensor) {
  const uint64_t n = 1000;
  OptimizerConfig c;
  c.freeze_step = 5;
  c.variance_floor = 0.1f;
  OptimizerConfig unfloored = c;
  unfloored.variance_floor = 0.0f;
  std::vector<LocalSegment> segs = {{0, 400}, {400, n}};
  MomentOptimizer opt(c, n, segs), raw(unfloored, n, segs);
  std::vector<float> x = Weights(n), y = Weights(n);
  for (int t = 0; t < 5; ++t) {
    opt.Step(Gradient(n, t), absl::MakeSpan(x));
    raw.Step(Gradient(n, t), absl::MakeSpan(y));
  }
  uint64_t floored = 0;
  for (const LocalSegment& s : segs) {
    double mean = 0;
    for (uint64_t i = s.begin; i < s.end; ++i) {
      mean += std::sqrt(double{raw.v()[i]});
    }
    float floor = static_cast<float>(double{0.1f} * mean / double(s.end - s.begin));
    for (uint64_t i = s.begin; i < s.end; ++i) {
      float root = std::sqrt(raw.v()[i]);
      float want = root < floor ? floor * floor : raw.v()[i];
      ASSERT_EQ(opt.v()[i], want) << i;
      if (root < floor) ++floored;
    }
  }
  // Coordinates with no gradient (every 37th) had v = 0 and were floored.
  EXPECT_GE(floored, n / 37);
}

// With the fp32 codec the preconditioned stage (pushes carry D g, momentum
// kept as D m) is the same algorithm as frozen-variance Adam in raw space.
TEST(Optimizer, PreconditionedStageEqualsFrozenVarianceAdam) {
  const uint64_t n = 2000;
  OptimizerConfig robust;
  robust.freeze_step = 20;
  robust.variance_floor = 0.0f;  // compare the spaces alone
  OptimizerConfig raw = robust;
  raw.preconditioned = false;
  MomentOptimizer a(robust, n, {{0, n}}), b(raw, n, {{0, n}});
  std::vector<float> xa = Weights(n), xb = Weights(n);
  StepBoth(a, xa, b, xb, 0, 20);
  ASSERT_EQ(0, std::memcmp(xa.data(), xb.data(), n * sizeof(float)));
  EXPECT_EQ(b.expected_space(), v1::GRADIENT_SPACE_RAW);
  std::vector<float> d(n);
  for (uint64_t i = 0; i < n; ++i) {
    d[i] = 1.0f / (std::sqrt(a.frozen_variance()[i]) + robust.eps);
  }
  for (int t = 20; t < 120; ++t) {
    std::vector<float> g = Gradient(n, t, 0.1f);
    std::vector<float> dg(n);
    for (uint64_t i = 0; i < n; ++i) dg[i] = d[i] * g[i];
    a.Step(dg, absl::MakeSpan(xa));
    b.Step(g, absl::MakeSpan(xb));
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(xa[i], xb[i], 2e-5 * std::max(1.0f, std::fabs(xb[i]))) << i;
  }
}

// --variance_growth: with a constant gradient g, plain Adam without bias
// correction steps lr (1 - b1^t) / sqrt(1 - b2^t) sign(g) (eps aside), its v
// growing as (1 - b2^t) g^2; the frozen stage with growth takes the same
// steps, with the momentum kept on the shard or pushed by the workers, and
// without growth takes larger ones (its v stays at round T's).
TEST(Optimizer, VarianceGrowthMakesTheFrozenStepsAdamsUnderAConstantGradient) {
  const uint64_t n = 8;
  const int freeze = 30;
  const std::vector<float> g = {0.3f, -0.02f, 1.5f, -0.7f,
                                0.05f, 2.0f, -1.0f, 0.4f};
  for (bool worker_momentum : {false, true}) {
    SCOPED_TRACE(worker_momentum ? "worker momentum" : "server momentum");
    OptimizerConfig c;
    c.freeze_step = freeze;
    c.variance_floor = 0.0f;
    c.worker_momentum = worker_momentum;
    OptimizerConfig plain = c;
    c.variance_growth = true;
    MomentOptimizer grown(c, n, {{0, n}}), fixed(plain, n, {{0, n}});
    std::vector<float> x1(n, 0.0f), x2(n, 0.0f);
    std::vector<float> u(n, 0.0f);  // the workers' momentum after the freeze
    for (int t = 1; t <= 300; ++t) {
      std::vector<float> push = g;
      if (t > freeze) {
        for (uint64_t i = 0; i < n; ++i) {
          float d = 1.0f / (std::sqrt(grown.frozen_variance()[i]) + c.eps);
          push[i] = d * g[i];
          if (worker_momentum) {
            u[i] = c.beta1 * u[i] + (1.0f - c.beta1) * push[i];
            push[i] = u[i];
          }
        }
      }
      std::vector<float> before1 = x1, before2 = x2;
      grown.Step(push, absl::MakeSpan(x1));
      fixed.Step(push, absl::MakeSpan(x2));
      const double b1t = 1.0 - std::pow(double{c.beta1}, t);
      const double b2t = 1.0 - std::pow(double{c.beta2}, t);
      for (uint64_t i = 0; i < n; ++i) {
        const double adam = c.lr * b1t / std::sqrt(b2t) * (g[i] > 0 ? 1 : -1);
        const double step1 = before1[i] - x1[i];
        const double step2 = before2[i] - x2[i];
        ASSERT_NEAR(step1, adam, 1e-4 * std::fabs(adam)) << "round " << t;
        if (t <= freeze) {
          ASSERT_NEAR(step2, adam, 1e-4 * std::fabs(adam)) << "round " << t;
        } else if (t == 300) {
          // sqrt((1 - b2^300) / (1 - b2^30)) = 2.86 at b2 = 0.999.
          EXPECT_NEAR(step2 / adam,
                      std::sqrt(b2t / (1.0 - std::pow(double{c.beta2}, freeze))),
                      1e-3);
        }
      }
    }
  }
}

// With bias correction the frozen v is corrected already: growth is 1.
TEST(Optimizer, VarianceGrowthChangesNothingWithBiasCorrection) {
  const uint64_t n = 500;
  OptimizerConfig c;
  c.freeze_step = 10;
  c.bias_correction = true;
  OptimizerConfig grow = c;
  grow.variance_growth = true;
  MomentOptimizer a(c, n, {{0, n}}), b(grow, n, {{0, n}});
  std::vector<float> xa = Weights(n), xb = Weights(n);
  StepBoth(a, xa, b, xb, 0, 40);
  EXPECT_EQ(0, std::memcmp(xa.data(), xb.data(), n * sizeof(float)));
}

TEST(Optimizer, DecoupledWeightDecayAndLearningRateFollowTheFormula) {
  // With zero gradients Adam's update is 0 and only decay acts:
  // x_{t+1} = x_t - lr * wd * x_t.
  const uint64_t n = 64;
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.lr = 0.1f;
  c.weight_decay = 0.5f;
  MomentOptimizer opt(c, n, {{0, n}});
  std::vector<float> x(n, 2.0f), zero(n, 0.0f);
  opt.Step(zero, absl::MakeSpan(x));
  EXPECT_FLOAT_EQ(x[0], 2.0f - 0.1f * 0.5f * 2.0f);
  // A new lr takes effect on the next step.
  opt.set_lr(0.2f);
  opt.Step(zero, absl::MakeSpan(x));
  EXPECT_FLOAT_EQ(x[0], 1.9f - 0.2f * 0.5f * 1.9f);
  // First Adam step without bias correction: m = (1-b1) g, v = (1-b2) g^2,
  // update = 0.1 / sqrt(0.001) * sign(g) (eps negligible).
  OptimizerConfig c2;
  c2.kind = OptimizerKind::kAdam;
  c2.lr = 0.01f;
  MomentOptimizer opt2(c2, 1, {{0, 1}});
  std::vector<float> y = {1.0f}, g = {3.0f};
  double step = opt2.Step(g, absl::MakeSpan(y));
  double want = 0.01 * (0.1 * 3.0) / (std::sqrt(0.001 * 9.0) + 1e-8);
  EXPECT_NEAR(y[0], 1.0 - want, 1e-6);
  EXPECT_NEAR(step, want, 1e-6);
}

TEST(Optimizer, SgdMomentumFollowsTheFormula) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.1f;
  c.momentum = 0.9f;
  MomentOptimizer opt(c, 1, {{0, 1}});
  std::vector<float> x = {1.0f}, g = {1.0f};
  opt.Step(g, absl::MakeSpan(x));  // buf = 1, x = 0.9
  opt.Step(g, absl::MakeSpan(x));  // buf = 1.9, x = 0.71
  EXPECT_NEAR(x[0], 0.71f, 1e-6);
  EXPECT_EQ(opt.stage(), v1::OPTIMIZER_STAGE_WARMUP);
}

TEST(Optimizer, SgdNesterovFollowsTorchsFormula) {
  // torch.optim.SGD(nesterov=True): buf = mu buf + g; x -= lr (g + mu buf),
  // here against a double-precision loop over varying gradients.
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.7f;
  c.momentum = 0.9f;
  c.nesterov = true;
  MomentOptimizer opt(c, 3, {{0, 3}});
  std::vector<float> x = {1.0f, -2.0f, 0.5f};
  double rx[3] = {1.0, -2.0, 0.5}, buf[3] = {0, 0, 0};
  for (int t = 0; t < 5; ++t) {
    std::vector<float> g = {0.1f * t, -0.3f, 0.05f * (t - 2)};
    opt.Step(g, absl::MakeSpan(x));
    for (int i = 0; i < 3; ++i) {
      buf[i] = 0.9 * buf[i] + g[i];
      rx[i] -= 0.7 * (g[i] + 0.9 * buf[i]);
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(x[i], rx[i], 1e-5) << i;
  // Heavy-ball momentum gives another trajectory.
  c.nesterov = false;
  MomentOptimizer heavy(c, 1, {{0, 1}});
  std::vector<float> y = {1.0f}, g = {1.0f};
  heavy.Step(g, absl::MakeSpan(y));
  EXPECT_NEAR(y[0], 1.0f - 0.7f, 1e-6);  // Nesterov: 1 - 0.7 * 1.9
}

TEST(Optimizer, LargeShardUsesTwoChunksWithSameResult) {
  // The pool splits large shards; results must equal a one-chunk run.
  const uint64_t n = (1u << 18) + 77;
  OptimizerConfig c;
  c.freeze_step = 3;
  MomentOptimizer a(c, n, {{0, n}});
  std::vector<float> xa = Weights(n);
  std::vector<float> xs = xa;
  RefAdam ref = MakeRef(c, xs);
  for (int t = 0; t < 3; ++t) {
    std::vector<float> g = Gradient(n, t, 0.1f);
    a.Step(g, absl::MakeSpan(xa));
    ref.Step(g);
  }
  ExpectClose(xa, ref.x, 1e-6);
  // The same steps on one core (a pool without helpers) are bit-identical:
  // chunking never changes a parameter's arithmetic.
  ThreadPool none(0);
  MomentOptimizer one(c, n, {{0, n}}, &none);
  std::vector<float> x1 = Weights(n);
  for (int t = 0; t < 3; ++t) {
    std::vector<float> g = Gradient(n, t, 0.1f);
    one.Step(g, absl::MakeSpan(x1));
  }
  EXPECT_EQ(std::memcmp(x1.data(), xa.data(), n * sizeof(float)), 0);
}

// The per-element loops run vectorized (AVX2 where the CPU has it) in
// tiles: every branch must still give, element for element, the bits of
// its scalar formula in float, in the order optimizer.h writes it, and the
// norm the serial sum of the changes' squares (up to the order of the sum).
// The reference reads m and v before each step, so it covers the frozen
// stages whatever the freeze did to them. n: several tiles and a tail, and
// large enough for the pool to split it.
TEST(Optimizer, EveryBranchIsItsScalarFormulaBitForBit) {
  const uint64_t n = (1u << 17) + 1029;
  struct Case {
    const char* name;
    OptimizerConfig c;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, auto edit) {
    OptimizerConfig c;
    c.lr = 0.01f;
    c.weight_decay = 0.05f;
    c.freeze_step = 2;
    c.bias_correction = true;  // GrowthScale() is 1
    edit(c);
    cases.push_back({name, c});
  };
  add("sgd", [](OptimizerConfig& c) { c.kind = OptimizerKind::kSgd; });
  add("nesterov", [](OptimizerConfig& c) {
    c.kind = OptimizerKind::kSgd;
    c.nesterov = true;
  });
  add("adam", [](OptimizerConfig& c) { c.kind = OptimizerKind::kAdam; });
  add("adam_uncorrected", [](OptimizerConfig& c) {
    c.kind = OptimizerKind::kAdam;
    c.bias_correction = false;
  });
  add("onebit_worker_momentum", [](OptimizerConfig& c) {
    c.worker_momentum = true;
    c.compression_beta1 = 0.5f;
  });
  add("onebit_worker_momentum_raw", [](OptimizerConfig& c) {
    c.worker_momentum = true;
    c.preconditioned = false;
  });
  add("onebit_server_momentum", [](OptimizerConfig& c) {});
  add("onebit_server_momentum_raw",
      [](OptimizerConfig& c) { c.preconditioned = false; });
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const OptimizerConfig& c = k.c;
    MomentOptimizer opt(c, n, {{0, n}});
    std::vector<float> x = Weights(n);
    for (int t = 0; t < 5; ++t) {
      const std::vector<float> g = Gradient(n, t, 0.1f);
      const std::vector<float> x0 = x;
      const std::vector<float> m0(opt.m().begin(), opt.m().end());
      const std::vector<float> v0(opt.v().begin(), opt.v().end());
      const bool frozen = opt.frozen();
      const uint64_t step = opt.step();
      const double norm = opt.Step(g, absl::MakeSpan(x));
      const float lr = c.lr, wd = c.weight_decay, b1 = c.beta1, b2 = c.beta2;
      const float eps = c.eps, c1 = CompressionBeta1(c);
      float mc = 1.0f, vc = 1.0f;
      if (c.bias_correction) {
        const double s = static_cast<double>(step + 1);
        mc = static_cast<float>(1.0 / (1.0 - std::pow(double{b1}, s)));
        vc = static_cast<float>(1.0 / (1.0 - std::pow(double{b2}, s)));
      }
      double sq = 0;
      uint64_t wrong = 0, first_wrong = n;
      for (uint64_t i = 0; i < n; ++i) {
        float m = m0[i], d;
        if (c.kind == OptimizerKind::kSgd) {
          const float gi = g[i] + wd * x0[i];
          m = c.momentum * m + gi;
          d = c.nesterov ? lr * (gi + c.momentum * m) : lr * m;
        } else if (!frozen) {
          m = b1 * m + (1.0f - b1) * g[i];
          const float v = b2 * v0[i] + (1.0f - b2) * g[i] * g[i];
          const float update = (m * mc) / (std::sqrt(v * vc) + eps);
          d = lr * (update + wd * x0[i]);
        } else {
          float mom;
          if (c.worker_momentum) {
            m = c1 * m;
            mom = m + g[i];
          } else {
            m = c1 * m + (1.0f - c1) * g[i];
            mom = m;
          }
          d = c.preconditioned
                  ? lr * (mom + wd * x0[i])
                  : lr * (mom / (std::sqrt(v0[i]) + eps) + wd * x0[i]);
        }
        const float want = x0[i] - d;
        sq += double{d} * d;
        // A step that ends in the freeze rescales m afterwards (Freeze()).
        if (std::memcmp(&want, &x[i], sizeof(float)) != 0 ||
            (opt.frozen() == frozen &&
             std::memcmp(&m, &opt.m()[i], sizeof(float)) != 0)) {
          if (wrong++ == 0) first_wrong = i;
        }
      }
      EXPECT_EQ(wrong, 0u) << "round " << t << ", first at " << first_wrong;
      EXPECT_NEAR(norm, std::sqrt(sq), 1e-12 * std::sqrt(sq)) << "round " << t;
    }
    // The warmups above ran 2 rounds, then 3 frozen ones.
    if (c.kind == OptimizerKind::kOneBitAdam) {
      EXPECT_TRUE(opt.frozen());
    }
  }
}

TEST(Optimizer, ConfigValidationNamesTheField) {
  OptimizerConfig c;
  c.beta1 = 1.5f;
  absl::Status s = ValidateOptimizerConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("beta1"), std::string::npos) << s;
  for (float bad : {1.0f, -0.5f, std::nanf("")}) {
    c = OptimizerConfig();
    c.compression_beta1 = bad;
    s = ValidateOptimizerConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("compression_beta1"), std::string::npos) << s;
    EXPECT_NE(s.message().find("-1 for beta1"), std::string::npos) << s;
  }
  for (float good : {-1.0f, 0.0f, 0.5f}) {
    c = OptimizerConfig();
    c.compression_beta1 = good;
    EXPECT_TRUE(ValidateOptimizerConfig(c).ok()) << good;
  }
  c = OptimizerConfig();
  c.freeze_step = 0;
  EXPECT_NE(ValidateOptimizerConfig(c).message().find("freeze_step"),
            std::string::npos);
}

}  // namespace
}  // namespace pserver
