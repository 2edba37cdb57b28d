// MomentOptimizer (server/moment_optimizer.h) beyond the update formulas of
// optimizer_test.cc: the stage and expected space around the freeze,
// FastForward (a shard catching up with its workers) and RestoreState.
#include "server/moment_optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

OptimizerConfig OneBit(uint64_t freeze_step, bool preconditioned = true) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kOneBitAdam;
  c.freeze_step = freeze_step;
  c.preconditioned = preconditioned;
  return c;
}

void Steps(MomentOptimizer& opt, int k, std::vector<float>& x) {
  for (int i = 0; i < k; ++i) {
    opt.Step(testing_util::Gradient(x.size(), 0, opt.step()), absl::MakeSpan(x));
  }
}

TEST(MomentOptimizer, StageAndSpaceFlipExactlyAtTheFreeze) {
  const uint64_t n = 64;
  MomentOptimizer opt(OneBit(3), n, {{0, n}});
  std::vector<float> x(n, 1.0f);
  EXPECT_EQ(opt.freeze_at(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(opt.stage(), v1::OPTIMIZER_STAGE_WARMUP) << opt.step();
    EXPECT_EQ(opt.expected_space(), v1::GRADIENT_SPACE_RAW);
    EXPECT_TRUE(opt.frozen_variance().empty());
    Steps(opt, 1, x);
  }
  EXPECT_EQ(opt.step(), 3u);
  EXPECT_TRUE(opt.frozen());
  EXPECT_EQ(opt.stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  EXPECT_EQ(opt.expected_space(), v1::GRADIENT_SPACE_PRECONDITIONED);
  EXPECT_EQ(opt.frozen_variance().size(), n);
  // DeepSpeed-exact mode freezes too but keeps raw gradients.
  MomentOptimizer raw(OneBit(1, /*preconditioned=*/false), n, {{0, n}});
  Steps(raw, 1, x);
  EXPECT_TRUE(raw.frozen());
  EXPECT_EQ(raw.expected_space(), v1::GRADIENT_SPACE_RAW);
}

TEST(MomentOptimizer, OtherOptimizersNeverFreeze) {
  const uint64_t n = 16;
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    OptimizerConfig c = OneBit(1);
    c.kind = kind;
    MomentOptimizer opt(c, n, {{0, n}});
    std::vector<float> x(n, 1.0f);
    Steps(opt, 5, x);
    EXPECT_FALSE(opt.frozen());
    EXPECT_EQ(opt.freeze_at(), 0u);
    EXPECT_EQ(opt.stage(), v1::OPTIMIZER_STAGE_WARMUP);
    EXPECT_EQ(opt.expected_space(), v1::GRADIENT_SPACE_RAW);
    EXPECT_EQ(opt.v().size(), kind == OptimizerKind::kSgd ? 0u : n);
  }
}

TEST(MomentOptimizer, FastForwardFromFreshWeightsRestartsTheWarmup) {
  const uint64_t n = 32;
  MomentOptimizer opt(OneBit(5), n, {{0, n}});
  opt.FastForward(50);
  EXPECT_EQ(opt.step(), 50u);
  EXPECT_FALSE(opt.frozen());
  EXPECT_EQ(opt.freeze_at(), 55u);
  std::vector<float> x(n, 1.0f);
  Steps(opt, 4, x);
  EXPECT_FALSE(opt.frozen());
  Steps(opt, 1, x);
  EXPECT_TRUE(opt.frozen());
  EXPECT_EQ(opt.step(), 55u);
}

TEST(MomentOptimizer, FastForwardAcrossTheFreezeAfterRoundsFreezesNow) {
  const uint64_t n = 32;
  MomentOptimizer opt(OneBit(10), n, {{0, n}});
  std::vector<float> x(n, 1.0f);
  Steps(opt, 2, x);
  const std::vector<float> m_before(opt.m().begin(), opt.m().end());
  opt.FastForward(4);  // before the freeze: only the counter moves
  EXPECT_EQ(opt.step(), 4u);
  EXPECT_FALSE(opt.frozen());
  EXPECT_EQ(std::vector<float>(opt.m().begin(), opt.m().end()), m_before);
  opt.FastForward(12);
  EXPECT_TRUE(opt.frozen());
  EXPECT_EQ(opt.freeze_at(), 10u);
  EXPECT_EQ(opt.stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  // Backwards or to the same step: nothing.
  opt.FastForward(3);
  opt.FastForward(12);
  EXPECT_EQ(opt.step(), 12u);
}

TEST(MomentOptimizer, RestoreStateResumesWhereTheSavedOneStood) {
  const uint64_t n = 32;
  MomentOptimizer a(OneBit(5), n, {{0, n}});
  a.FastForward(50);  // freeze moved to 55
  std::vector<float> xa(n, 1.0f);
  Steps(a, 2, xa);
  MomentOptimizer b(OneBit(5), n, {{0, n}});
  b.RestoreState(a.step(), a.frozen(), std::vector<float>(a.m().begin(), a.m().end()),
                 std::vector<float>(a.v().begin(), a.v().end()), a.freeze_at());
  EXPECT_EQ(b.step(), 52u);
  EXPECT_EQ(b.freeze_at(), 55u);
  std::vector<float> xb = xa;
  Steps(a, 4, xa);
  Steps(b, 4, xb);
  EXPECT_EQ(xa, xb);  // the same updates, the freeze at the same step
  EXPECT_TRUE(b.frozen());
  EXPECT_EQ(std::vector<float>(a.v().begin(), a.v().end()),
            std::vector<float>(b.v().begin(), b.v().end()));
  // freeze_at 0 keeps the configured freeze step.
  MomentOptimizer c(OneBit(5), n, {{0, n}});
  c.RestoreState(2, false, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f), 0);
  EXPECT_EQ(c.freeze_at(), 5u);
}

// --onebit_momentum=worker: the workers push u = b1 u + (1 - b1) g (u = 0
// at the freeze) and the shard adds its decaying freeze-time momentum. With
// exact (uncompressed) momenta that is the same m as the shard's own
// momentum of the same gradients, so both modes take the same steps (to
// rounding), preconditioned and DeepSpeed-raw, with the compression stage's
// beta1 left at beta1 or set apart (--compression_beta1).
TEST(MomentOptimizer, WorkerMomentumEqualsShardMomentumWithoutCompression) {
  const uint64_t n = 48;
  for (float c1 : {-1.0f, 0.5f})
  for (bool preconditioned : {true, false}) {
    OptimizerConfig shard_side = OneBit(4, preconditioned);
    shard_side.compression_beta1 = c1;
    OptimizerConfig worker_side = shard_side;
    worker_side.worker_momentum = true;
    const float beta = WorkerMomentumBeta(worker_side);
    EXPECT_EQ(beta, c1 < 0 ? worker_side.beta1 : c1);
    MomentOptimizer a(shard_side, n, {{0, n}}), b(worker_side, n, {{0, n}});
    std::vector<float> xa(n, 0.5f), xb(n, 0.5f), u(n, 0.0f);
    for (int t = 0; t < 40; ++t) {
      std::vector<float> g = testing_util::Gradient(n, 7, t);
      a.Step(g, absl::MakeSpan(xa));
      if (b.frozen()) {
        for (uint64_t i = 0; i < n; ++i) {
          u[i] = beta * u[i] + (1 - beta) * g[i];
        }
        b.Step(u, absl::MakeSpan(xb));
      } else {
        b.Step(g, absl::MakeSpan(xb));
      }
    }
    ASSERT_TRUE(b.frozen());
    double worst = 0;
    for (uint64_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs(double{xa[i]} - xb[i]));
      // Not a trivially equal pair: the run moved the weights.
      ASSERT_GT(std::abs(xa[i] - 0.5f), 1e-4f) << i;
    }
    EXPECT_LT(worst, 1e-6) << "preconditioned=" << preconditioned
                           << " compression_beta1=" << c1;
  }
}

// --compression_beta1 changes only the steps after the freeze: the warmup
// is bit for bit beta1's, and the compression stage then differs.
TEST(MomentOptimizer, CompressionBeta1AppliesFromTheFreezeOn) {
  const uint64_t n = 32;
  OptimizerConfig same = OneBit(6);
  OptimizerConfig apart = same;
  apart.compression_beta1 = 0.5f;
  MomentOptimizer a(same, n, {{0, n}}), b(apart, n, {{0, n}});
  std::vector<float> xa(n, 0.5f), xb(n, 0.5f);
  for (int t = 0; t < 12; ++t) {
    std::vector<float> g = testing_util::Gradient(n, 3, t);
    a.Step(g, absl::MakeSpan(xa));
    b.Step(g, absl::MakeSpan(xb));
    if (!a.frozen() || t == 5) {
      ASSERT_EQ(xa, xb) << "round " << t;
    }
  }
  ASSERT_TRUE(b.frozen());
  EXPECT_NE(xa, xb);
}

// A tensor with no gradient in any round before the freeze (.grad None
// throughout) would freeze with v = 0 and then step by m / eps once a
// gradient came; it takes the other tensors' mean sqrt(v) instead, in both
// modes, and its first steps after the freeze are of the others' size.
TEST(MomentOptimizer, ATensorUnseenBeforeTheFreezeTakesTheOthersVariance) {
  const uint64_t n = 64, half = 32;
  for (bool preconditioned : {true, false}) {
    OptimizerConfig c = OneBit(3, preconditioned);
    c.lr = 1e-2f;
    MomentOptimizer opt(c, n, {{0, half}, {half, n}});
    std::vector<float> x(n, 1.0f);
    for (int t = 0; t < 3; ++t) {
      opt.SkipNext({false, true});  // the second tensor: no gradient
      Steps(opt, 1, x);
    }
    ASSERT_TRUE(opt.frozen());
    const absl::Span<const float> v = opt.frozen_variance();
    ASSERT_EQ(v.size(), n);
    double seen = 0;
    for (uint64_t i = 0; i < half; ++i) seen += std::sqrt(double{v[i]});
    seen /= half;
    for (uint64_t i = half; i < n; ++i) {
      ASSERT_NEAR(std::sqrt(v[i]), seen, 1e-6 * seen) << "element " << i;
    }
    // The first step with a gradient moves it by about lr, not lr / eps.
    const std::vector<float> before = x;
    std::vector<float> g = testing_util::Gradient(n, 0, opt.step());
    if (preconditioned) {
      for (uint64_t i = 0; i < n; ++i) g[i] /= std::sqrt(v[i]) + c.eps;
    }
    opt.Step(g, absl::MakeSpan(x));
    for (uint64_t i = half; i < n; ++i) {
      EXPECT_LT(std::abs(x[i] - before[i]), 10 * c.lr)
          << "element " << i << (preconditioned ? "" : " (DeepSpeed mode)");
    }
  }
}

}  // namespace
}  // namespace pserver
