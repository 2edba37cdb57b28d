// Issue 27: learning-rate schedules, per-tensor hyper-parameter groups,
// hyper-parameters pushed by the workers, and buffers that are averaged
// rather than optimized.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/layout.h"
#include "common/rejection.h"
#include "common/schedule.h"
#include "gtest/gtest.h"
#include "server/lr_schedule.h"
#include "server/moment_optimizer.h"
#include "server/round_hyper.h"
#include "server/shard.h"
#include "tests/server/ref_adam.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using testing_util::DecodeAll;
using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::Registered;

// ---- The shards' schedule ------------------------------------------------

TEST(LrSchedule, LinearWarmupThenConstant) {
  LrSchedule s{1.0f, 4, LrDecay::kConstant, 0, 0.0f};
  const std::vector<float> want = {0.25f, 0.5f, 0.75f, 1.0f, 1.0f, 1.0f};
  for (uint64_t t = 0; t < want.size(); ++t) {
    EXPECT_FLOAT_EQ(ScheduledLr(s, t), want[t]) << "round " << t;
  }
  EXPECT_FLOAT_EQ(ScheduledLr(s, 1000000), 1.0f);
}

TEST(LrSchedule, CosineFromPeakToMinimumAfterWarmup) {
  LrSchedule s{1.0f, 2, LrDecay::kCosine, 10, 0.1f};
  EXPECT_FLOAT_EQ(ScheduledLr(s, 0), 0.5f);
  EXPECT_FLOAT_EQ(ScheduledLr(s, 2), 1.0f);  // decay's first round: the peak
  EXPECT_NEAR(ScheduledLr(s, 7), 0.55f, 1e-6);  // half way: (1 + 0.1) / 2
  EXPECT_NEAR(ScheduledLr(s, 4), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.2)),
              1e-6);
  EXPECT_FLOAT_EQ(ScheduledLr(s, 12), 0.1f);
  EXPECT_FLOAT_EQ(ScheduledLr(s, 500), 0.1f);
}

TEST(LrSchedule, LinearDecayWithoutWarmup) {
  LrSchedule s{1.0f, 0, LrDecay::kLinear, 4, 0.0f};
  const std::vector<float> want = {1.0f, 0.75f, 0.5f, 0.25f, 0.0f, 0.0f};
  for (uint64_t t = 0; t < want.size(); ++t) {
    EXPECT_FLOAT_EQ(ScheduledLr(s, t), want[t]) << "round " << t;
  }
}

TEST(LrSchedule, BadSettingsAreRefusedByName) {
  absl::Status s = ValidateLrSchedule({1.0f, 0, LrDecay::kCosine, 0, 0.0f});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lr_decay_rounds"), std::string::npos) << s;
  s = ValidateLrSchedule({1.0f, 0, LrDecay::kLinear, 5, 2.0f});
  EXPECT_NE(s.message().find("min_lr is 2"), std::string::npos) << s;
  absl::StatusOr<LrDecay> d = ParseLrDecay("exponential");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("constant, linear or cosine"),
            std::string::npos);
  OptimizerConfig c;
  c.lr_decay = LrDecay::kCosine;
  EXPECT_FALSE(ValidateOptimizerConfig(c).ok());
}

TEST(LrSchedule, AScheduleFileReplacesTheFlags) {
  absl::StatusOr<std::shared_ptr<const CompressionSchedule>> file =
      CompressionSchedule::Parse(
          R"({"phases": [{"push": {"codec": "fp32"}}],
              "learning_rate": {"lr": 0.5, "warmup_rounds": 10,
                                "decay": "cosine", "decay_rounds": 90,
                                "min_lr": 0.05}})",
          "test");
  ASSERT_TRUE(file.ok()) << file.status();
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.lr_decay = LrDecay::kLinear;
  ASSERT_TRUE(ApplyLearningRateSchedule((*file)->proto(), &c).ok());
  EXPECT_EQ(c.lr, 0.5f);
  EXPECT_EQ(c.lr_warmup_rounds, 10u);
  EXPECT_EQ(c.lr_decay, LrDecay::kCosine);
  EXPECT_EQ(c.lr_decay_rounds, 90u);
  EXPECT_EQ(c.min_lr, 0.05f);
  EXPECT_TRUE(ValidateOptimizerConfig(c).ok());
  EXPECT_FLOAT_EQ(ScheduledLr(ScheduleOf(c), 4), 0.25f);
  // Without the section the flags stand; a bad decay is refused by name.
  OptimizerConfig d = c;
  ASSERT_TRUE(ApplyLearningRateSchedule(v1::CompressionSchedule(), &d).ok());
  EXPECT_EQ(d.lr_decay_rounds, 90u);
  v1::CompressionSchedule bad;
  bad.mutable_learning_rate()->set_decay("step");
  absl::Status s = ApplyLearningRateSchedule(bad, &d);
  EXPECT_NE(s.message().find("learning_rate.decay is 'step'"),
            std::string::npos) << s;
  EXPECT_EQ(d.lr_decay_rounds, 90u);
}

// ---- Groups and buffers in the optimizer ----------------------------------

// torch.optim.AdamW in double, at weights x0.
testing_util::RefAdam AdamW(absl::Span<const float> x0) {
  testing_util::RefAdam r = testing_util::RefAdam::At(x0);
  r.bias = true;
  return r;
}

TEST(GroupHyper, EachSegmentStepsWithItsGroupAndBuffersTakeTheMean) {
  // Large enough that the pool splits the slice; the segments cross chunks.
  const uint64_t n = 300000;
  const uint64_t a = 100001, b = 250007;  // group 0 | group 1 | buffer
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.bias_correction = true;
  c.lr = 123.0f;  // never used: SetHyper gives every group its own
  MomentOptimizer opt(c, n, {{0, a, 0, false}, {a, b, 1, false},
                             {b, n, 0, true}});
  std::vector<float> x = InitialWeights(n);
  testing_util::RefAdam r0 = AdamW(absl::MakeConstSpan(x).subspan(0, a));
  testing_util::RefAdam r1 = AdamW(absl::MakeConstSpan(x).subspan(a, b - a));
  for (uint64_t t = 0; t < 5; ++t) {
    const float lr0 = 0.01f * (t + 1), lr1 = 0.003f;
    opt.SetHyper({{lr0, 0.1f}, {lr1, 0.0f}});
    std::vector<float> g = Gradient(n, 0, t, 0.1f);
    opt.Step(g, absl::MakeSpan(x));
    r0.lr = lr0, r0.wd = 0.1;
    r0.Step(g);
    r1.lr = lr1, r1.wd = 0.0;
    r1.Step(absl::MakeConstSpan(g).subspan(a));
    for (uint64_t i = b; i < n; ++i) {
      ASSERT_EQ(x[i], g[i]) << "buffer element " << i << " round " << t;
    }
  }
  for (uint64_t i = 0; i < a; ++i) {
    ASSERT_NEAR(x[i], r0.x[i], 1e-5) << "group 0 element " << i;
  }
  for (uint64_t i = a; i < b; ++i) {
    ASSERT_NEAR(x[i], r1.x[i - a], 1e-5) << "group 1 element " << i;
  }
  // Buffers keep no moments.
  for (uint64_t i = b; i < n; ++i) ASSERT_EQ(opt.m()[i], 0.0f);
}

TEST(GroupHyper, OneBitAdamStepsEachGroupWithItsValuesInBothStages) {
  // Segments [0, 512) and [512, 1024): in group 1 at lr 0 nothing moves
  // (before and after the freeze); group 0 steps exactly as a one-group
  // optimizer over the whole slice with the same values.
  const uint64_t n = 1024;
  OptimizerConfig c;
  c.kind = OptimizerKind::kOneBitAdam;
  c.freeze_step = 3;
  c.lr = 0.02f;
  c.weight_decay = 0.01f;
  MomentOptimizer grouped(c, n, {{0, 512, 0, false}, {512, n, 1, false}});
  MomentOptimizer whole(c, n, {{0, 512, 0, false}, {512, n, 0, false}});
  std::vector<float> xg = InitialWeights(n), xw = xg;
  const std::vector<float> x0 = xg;
  for (uint64_t t = 0; t < 6; ++t) {
    grouped.SetHyper({{0.02f, 0.01f}, {0.0f, 0.01f}});
    std::vector<float> g = Gradient(n, 0, t, 0.1f);
    grouped.Step(g, absl::MakeSpan(xg));
    whole.Step(g, absl::MakeSpan(xw));
  }
  ASSERT_TRUE(grouped.frozen());
  for (uint64_t i = 0; i < 512; ++i) ASSERT_EQ(xg[i], xw[i]) << i;
  for (uint64_t i = 512; i < n; ++i) ASSERT_EQ(xg[i], x0[i]) << i;
}

TEST(GroupHyper, WithoutSetHyperEveryGroupTakesTheConfig) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.5f;
  c.momentum = 0.0f;
  MomentOptimizer opt(c, 8, {{0, 4, 0, false}, {4, 8, 3, false}});
  std::vector<float> x(8, 1.0f), g(8, 1.0f);
  opt.Step(g, absl::MakeSpan(x));
  for (float v : x) EXPECT_EQ(v, 0.5f);
}

// ---- Layouts with groups and kinds ----------------------------------------

v1::ModelLayout GroupedLayout() {
  v1::ModelLayout l = testing_util::SmallLayout();  // w [3,256], b [256]
  l.mutable_tensors(1)->set_group(1);
  l.add_groups()->set_weight_decay(0.1f);
  l.add_groups()->set_weight_decay(0.0f);
  return l;
}

TEST(GroupLayout, BadGroupsAndKindsAreRefusedByField) {
  v1::ModelLayout l = GroupedLayout();
  ASSERT_TRUE(ValidateLayout(l).ok());
  l.mutable_tensors(1)->set_group(2);
  absl::Status s = ValidateLayout(l).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layout.tensors[1].group is 2; expected 0..1"),
            std::string::npos) << s;
  l = GroupedLayout();
  l.mutable_groups(0)->set_lr_scale(-1.0f);
  s = ValidateLayout(l).status();
  EXPECT_NE(s.message().find("layout.groups[0].lr_scale is -1"),
            std::string::npos) << s;
  l = GroupedLayout();
  l.mutable_groups(1)->set_weight_decay(NAN);
  s = ValidateLayout(l).status();
  EXPECT_NE(s.message().find("layout.groups[1].weight_decay"),
            std::string::npos) << s;
  l = GroupedLayout();
  l.mutable_tensors(0)->set_kind(static_cast<v1::TensorKind>(9));
  s = ValidateLayout(l).status();
  EXPECT_NE(s.message().find("layout.tensors[0].kind is 9"), std::string::npos)
      << s;
  l = testing_util::SmallLayout();
  for (int g = 0; g <= kMaxParamGroups; ++g) l.add_groups();
  s = ValidateLayout(l).status();
  EXPECT_NE(s.message().find("layout.groups has 257 groups"),
            std::string::npos) << s;
  // Without groups, group 0 is the only one.
  l = testing_util::SmallLayout();
  l.mutable_tensors(0)->set_group(1);
  EXPECT_FALSE(ValidateLayout(l).ok());
}

TEST(GroupLayout, FirstDifferenceNamesGroupKindAndGroupValues) {
  v1::ModelLayout a = GroupedLayout(), b = GroupedLayout();
  EXPECT_EQ(FirstLayoutDifference(a, b), "");
  b.mutable_tensors(1)->set_group(0);
  EXPECT_EQ(FirstLayoutDifference(a, b),
            "layout.tensors[1] ('b').group is 1, expected 0");
  b = GroupedLayout();
  b.mutable_tensors(1)->set_kind(v1::TENSOR_KIND_BUFFER);
  EXPECT_EQ(FirstLayoutDifference(a, b),
            "layout.tensors[1] ('b').kind is parameter, expected buffer");
  b = GroupedLayout();
  b.mutable_groups(0)->set_weight_decay(0.2f);
  EXPECT_EQ(FirstLayoutDifference(a, b),
            "layout.groups[0] is {lr_scale 1, weight_decay 0.1}, "
            "expected {lr_scale 1, weight_decay 0.2}");
  // A layout from before groups (a checkpoint, pserver_worker's) equals one
  // that spells the default group out, but not one that changes it.
  v1::ModelLayout plain = testing_util::SmallLayout();
  v1::ModelLayout spelled = plain;
  spelled.add_groups()->set_lr_scale(1.0f);
  EXPECT_EQ(FirstLayoutDifference(spelled, plain), "");
  EXPECT_EQ(FirstLayoutDifference(plain, spelled), "");
  spelled.mutable_groups(0)->set_weight_decay(0.0f);
  EXPECT_EQ(FirstLayoutDifference(spelled, plain),
            "layout.groups[0] is {lr_scale 1, weight_decay 0}, expected "
            "{lr_scale 1, weight_decay unset}");
}

// ---- The round's hyper-parameters -----------------------------------------

v1::PushRequest WithHyper(uint32_t worker,
                          std::vector<std::pair<float, float>> values) {
  v1::PushRequest p;
  p.set_worker_id(worker);
  p.set_step(3);
  for (auto [lr, wd] : values) {
    v1::HyperParams* h = p.add_hyper();
    h->set_lr(lr);
    h->set_weight_decay(wd);
  }
  return p;
}

TEST(RoundHyper, ValidatesCountAndValues) {
  EXPECT_TRUE(RoundHyper::Validate(WithHyper(0, {}), 2).ok());
  EXPECT_TRUE(RoundHyper::Validate(WithHyper(0, {{1, 0}, {2, 0.1f}}), 2).ok());
  absl::Status s = RoundHyper::Validate(WithHyper(0, {{1, 0}}), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(s), v1::REJECT_REASON_INVALID_FIELD);
  EXPECT_NE(s.message().find("hyper has 1 entries; expected 0 or 2"),
            std::string::npos) << s;
  s = RoundHyper::Validate(WithHyper(0, {{1, 0}, {NAN, 0}}), 2);
  EXPECT_NE(s.message().find("hyper[1].lr is nan"), std::string::npos) << s;
  s = RoundHyper::Validate(WithHyper(0, {{1, -0.5f}}), 1);
  EXPECT_NE(s.message().find("hyper[0].weight_decay is -0.5"),
            std::string::npos) << s;
}

TEST(RoundHyper, BspRefusesADifferentValueNamingBothWorkers) {
  RoundHyper h;
  v1::PushRequest first = WithHyper(0, {{0.5f, 0.1f}});
  ASSERT_TRUE(h.Check(first, true).ok());
  h.Record(first);
  EXPECT_TRUE(h.Check(WithHyper(1, {{0.5f, 0.1f}}), true).ok());
  absl::Status s = h.Check(WithHyper(1, {{0.25f, 0.1f}}), true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(s), v1::REJECT_REASON_HYPER_MISMATCH);
  EXPECT_NE(s.message().find("hyper of worker 1 for step 3 is [{lr 0.25, "
                             "weight_decay 0.1}]; worker 0 pushed [{lr 0.5, "
                             "weight_decay 0.1}]"),
            std::string::npos) << s;
  // No values at all is a value too: the shard's own schedule.
  s = h.Check(WithHyper(1, {}), true);
  EXPECT_NE(s.message().find("none (the shard's own schedule)"),
            std::string::npos) << s;
  // ssp/async: not checked.
  EXPECT_TRUE(h.Check(WithHyper(1, {{0.25f, 0.1f}}), false).ok());
  h.Clear();
  EXPECT_TRUE(h.Check(WithHyper(1, {{0.25f, 0.1f}}), true).ok());
}

TEST(RoundHyper, RelaxedRoundsKeepTheLatestStepsValues) {
  RoundHyper h;
  v1::PushRequest newer = WithHyper(0, {{0.1f, 0.0f}});
  newer.set_step(7);
  v1::PushRequest stale = WithHyper(1, {{0.9f, 0.0f}});
  stale.set_step(5);
  h.Record(newer);
  h.Record(stale);  // computed on older weights: its rate is older too
  OptimizerConfig c;
  EXPECT_FLOAT_EQ(h.For(7, c, testing_util::SmallLayout())[0].lr, 0.1f);
}

TEST(RoundHyper, WithoutPushedValuesTheScheduleScaledPerGroup) {
  OptimizerConfig c;
  c.lr = 2.0f;
  c.lr_warmup_rounds = 4;
  c.weight_decay = 0.01f;
  v1::ModelLayout l = GroupedLayout();
  l.mutable_groups(1)->set_lr_scale(0.5f);
  l.mutable_groups(1)->clear_weight_decay();
  std::vector<GroupHyper> h = RoundHyper().For(1, c, l);  // lr 2 * 2/4
  ASSERT_EQ(h.size(), 2u);
  EXPECT_FLOAT_EQ(h[0].lr, 1.0f);
  EXPECT_FLOAT_EQ(h[0].weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(h[1].lr, 0.5f);
  EXPECT_FLOAT_EQ(h[1].weight_decay, 0.01f);  // unset: the shard's
  RoundHyper pushed;
  pushed.Record(WithHyper(0, {{0.3f, 0.0f}, {0.2f, 0.05f}}));
  h = pushed.For(1, c, l);
  EXPECT_FLOAT_EQ(h[1].lr, 0.2f);
  EXPECT_FLOAT_EQ(h[1].weight_decay, 0.05f);
}

// ---- Through a shard -------------------------------------------------------

constexpr uint64_t kN = testing_util::kSmallElements;  // w: 768, b: 256

std::vector<float> Snapshot(Shard& shard, uint64_t step) {
  absl::StatusOr<v1::PullResponse> r = shard.PullBlocking(
      PullRequestFor(0, step, -1, 0, /*want_snapshot=*/true),
      absl::Seconds(10));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? DecodeAll(r->weights()) : std::vector<float>();
}

TEST(ShardHyper, PushedValuesStepEachGroupAsAdamW) {
  ShardConfig c = testing_util::ExactSgdConfig(2);
  c.optimizer.kind = OptimizerKind::kAdam;
  c.optimizer.bias_correction = true;
  c.optimizer.lr = 5.0f;  // overridden by every push
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = Registered(c, GroupedLayout(), x0);
  ASSERT_NE(shard, nullptr);
  testing_util::RefAdam ref = AdamW(absl::MakeConstSpan(x0).subspan(0, 768));
  ref.wd = 0.1;
  for (uint64_t t = 0; t < 3; ++t) {
    const float lr = 0.01f / (t + 1);
    std::vector<float> mean(kN, 0.0f);
    for (uint32_t w = 0; w < 2; ++w) {
      std::vector<float> g = Gradient(kN, w, t, 0.1f);
      for (uint64_t i = 0; i < kN; ++i) mean[i] += g[i] / 2;
      v1::PushRequest p = PushRequestFor(w, t, Fp32Tensor(g));
      v1::HyperParams* h0 = p.add_hyper();
      h0->set_lr(lr);
      h0->set_weight_decay(0.1f);
      p.add_hyper();  // group 1 (the bias): lr 0, weight decay 0
      absl::StatusOr<v1::PushResponse> r = shard->Push(p);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    ref.lr = lr;
    ref.Step(mean);
  }
  std::vector<float> x = Snapshot(*shard, 3);
  ASSERT_EQ(x.size(), kN);
  for (uint64_t i = 0; i < 768; ++i) ASSERT_NEAR(x[i], ref.x[i], 1e-6) << i;
  for (uint64_t i = 768; i < kN; ++i) ASSERT_EQ(x[i], x0[i]) << i;
}

TEST(ShardHyper, DisagreeingWorkersAreRefusedAndTheStateIsUnchanged) {
  ShardConfig c = testing_util::ExactSgdConfig(2);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = Registered(c, GroupedLayout(), x0);
  ASSERT_NE(shard, nullptr);
  auto push = [&](uint32_t w, float lr) {
    v1::PushRequest p =
        PushRequestFor(w, 0, Fp32Tensor(Gradient(kN, w, 0, 0.1f)));
    for (int g = 0; g < 2; ++g) {
      v1::HyperParams* h = p.add_hyper();
      h->set_lr(lr);
      h->set_weight_decay(0.0f);
    }
    return shard->Push(p);
  };
  ASSERT_TRUE(push(0, 0.5f).ok());
  const v1::GetStatusResponse before = shard->Status();
  absl::StatusOr<v1::PushResponse> refused = push(1, 0.25f);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused.status()), v1::REJECT_REASON_HYPER_MISMATCH);
  EXPECT_NE(refused.status().message().find("worker 1"), std::string::npos);
  EXPECT_NE(refused.status().message().find("worker 0 pushed"),
            std::string::npos);
  const v1::GetStatusResponse after = shard->Status();
  EXPECT_EQ(after.state_checksum(), before.state_checksum());
  EXPECT_EQ(after.pushes_pending(), before.pushes_pending());
  EXPECT_EQ(after.current_step(), 0u);
  // A wrong count is malformed, not a disagreement.
  v1::PushRequest bad = PushRequestFor(1, 0, Fp32Tensor(Gradient(kN, 1, 0)));
  bad.add_hyper()->set_lr(0.5f);
  EXPECT_EQ(ReasonOf(shard->Push(bad).status()),
            v1::REJECT_REASON_INVALID_FIELD);
  // The agreeing push completes the round with the agreed rate.
  ASSERT_TRUE(push(1, 0.5f).ok());
  EXPECT_EQ(shard->Status().current_step(), 1u);
  std::vector<float> x = Snapshot(*shard, 1);
  std::vector<float> g0 = Gradient(kN, 0, 0, 0.1f), g1 = Gradient(kN, 1, 0, 0.1f);
  for (uint64_t i = 0; i < kN; i += 97) {
    EXPECT_NEAR(x[i], x0[i] - 0.5f * (g0[i] + g1[i]) / 2, 1e-6) << i;
  }
}

TEST(ShardHyper, TheScheduleInForceSurvivesACheckpointRestore) {
  const std::string dir = testing_util::MakeTempDir("hyper_ckpt");
  ShardConfig c = testing_util::ExactSgdConfig(1);
  c.optimizer.lr = 1.0f;
  c.optimizer.lr_warmup_rounds = 4;
  c.checkpoint_dir = dir;
  c.checkpoint_every = 0;
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> a = Registered(c, testing_util::SmallLayout(), x0);
  ASSERT_NE(a, nullptr);
  auto round = [](Shard& s, uint64_t t) {
    ASSERT_TRUE(s.Push(PushRequestFor(0, t, Fp32Tensor(Gradient(kN, 0, t))))
                    .ok());
  };
  round(*a, 0);
  round(*a, 1);
  ASSERT_TRUE(a->SaveCheckpoint().ok());
  const std::vector<float> x2 = Snapshot(*a, 2);
  absl::StatusOr<std::unique_ptr<Shard>> b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*b)->Status().current_step(), 2u);
  round(*a, 2);
  round(**b, 2);
  EXPECT_EQ((*b)->Status().state_checksum(), a->Status().state_checksum());
  // Round 2 of a 4-round warmup steps with lr 3/4, on both.
  const std::vector<float> x3 = Snapshot(**b, 3);
  const std::vector<float> g = Gradient(kN, 0, 2);
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(x3[i], x2[i] - 0.75f * g[i]) << i;
  }
}

TEST(ShardHyper, BuffersAreTheWorkersMeanAndPullExactly) {
  // 1-bit Adam with 1-bit pulls: the parameters' pulls are lossy, the
  // buffer's are not.
  ShardConfig c = testing_util::OneBitAdamConfig(2, /*freeze_step=*/2);
  v1::ModelLayout layout = testing_util::SmallLayout();
  layout.mutable_tensors(1)->set_kind(v1::TENSOR_KIND_BUFFER);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = Registered(c, layout, x0);
  ASSERT_NE(shard, nullptr);
  std::vector<float> replica = x0;
  for (uint64_t t = 0; t < 4; ++t) {
    const bool frozen =
        shard->Status().stage() == v1::OPTIMIZER_STAGE_COMPRESSION;
    for (uint32_t w = 0; w < 2; ++w) {
      std::vector<float> g = Gradient(kN, w, t, 0.1f);
      for (uint64_t i = 768; i < kN; ++i) {
        g[i] = static_cast<float>(w * 2 + 1) * (t + 1) + 0.25f * i;
      }
      v1::PushRequest p = PushRequestFor(
          w, t, Fp32Tensor(g),
          frozen ? v1::GRADIENT_SPACE_PRECONDITIONED : v1::GRADIENT_SPACE_RAW);
      absl::StatusOr<v1::PushResponse> r = shard->Push(p);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    absl::StatusOr<v1::PullResponse> pulled = shard->PullBlocking(
        PullRequestFor(0, t + 1, static_cast<int64_t>(t),
                       ChecksumOf(replica)),
        absl::Seconds(10));
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    ASSERT_EQ(pulled->kind(), v1::PULL_KIND_DELTA);
    // A delta: 1-bit for the parameters, fp32 for the buffer.
    const v1::EncodedTensor& d = pulled->weights();
    ASSERT_EQ(d.codec(), v1::CODEC_SEGMENTS);
    ASSERT_EQ(d.segments_size(), 2);
    EXPECT_EQ(d.segments(0).codec(), v1::CODEC_ONEBIT);
    EXPECT_EQ(d.segments(1).codec(), v1::CODEC_FP32);
    ASSERT_TRUE(DecoderFor(d.codec())
                    ->DecodeAccumulate(d, 1.0f, absl::MakeSpan(replica))
                    .ok());
    EXPECT_EQ(ChecksumOf(replica), pulled->replica_checksum());
    for (uint64_t i = 768; i < kN; ++i) {
      // Mean of (1, 3) * (t + 1) + 0.25 i, exact in float.
      ASSERT_EQ(replica[i], 2.0f * (t + 1) + 0.25f * i)
          << "element " << i << " after round " << t;
    }
  }
  EXPECT_EQ(shard->Status().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
}

// A round dropped when a worker resumes past it (ClearRound) takes its
// hyper-parameters with it: the next round is not compared with them.
TEST(ShardHyper, ARoundDroppedByAResumeForgetsItsValues) {
  ShardConfig c = testing_util::ExactSgdConfig(2);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = Registered(c, testing_util::SmallLayout(), x0);
  ASSERT_NE(shard, nullptr);
  auto push = [&](uint32_t w, uint64_t step, float lr) {
    v1::PushRequest p =
        PushRequestFor(w, step, Fp32Tensor(Gradient(kN, w, step, 0.1f)));
    v1::HyperParams* h = p.add_hyper();
    h->set_lr(lr);
    return shard->Push(p);
  };
  ASSERT_TRUE(push(0, 0, 0.5f).ok());  // round 0 half done, lr 0.5
  // Worker 1 comes back from another shard already at step 1.
  v1::RegisterRequest again = testing_util::RegisterRequestFor(1, 2, x0);
  again.set_resume_step(1);
  absl::StatusOr<v1::RegisterResponse> r = shard->Register(again);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(shard->Status().current_step(), 1u);
  // Round 1 with the next rate: not refused against round 0's.
  absl::StatusOr<v1::PushResponse> p1 = push(1, 1, 0.25f);
  EXPECT_TRUE(p1.ok()) << p1.status();
}

TEST(ShardHyper, BuffersAreRefusedUnderStalenessScaling) {
  ShardConfig c = testing_util::ExactSgdConfig(2);
  c.consistency.mode = Consistency::kSsp;
  c.consistency.max_staleness = 2;
  c.consistency.scale_by_staleness = true;
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(c, nullptr);
  ASSERT_TRUE(shard.ok()) << shard.status();
  v1::RegisterRequest r =
      testing_util::RegisterRequestFor(0, 2, InitialWeights(kN));
  r.mutable_layout()->mutable_tensors(1)->set_kind(v1::TENSOR_KIND_BUFFER);
  absl::StatusOr<v1::RegisterResponse> resp = (*shard)->Register(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(resp.status().message().find("layout.tensors[1] ('b') is a "
                                         "buffer"),
            std::string::npos) << resp.status();
  EXPECT_FALSE((*shard)->Status().model_registered());
}


// Broadcast buffers are worker 0's values exactly (3 workers: a mean would
// not be exact), and a round without worker 0 leaves them as they were.
TEST(ShardHyper, BroadcastBuffersAreWorkerZerosValuesOrStayPut) {
  ShardConfig c = testing_util::ExactSgdConfig(3);
  v1::ModelLayout layout = testing_util::SmallLayout();
  layout.mutable_tensors(1)->set_kind(v1::TENSOR_KIND_BROADCAST_BUFFER);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = Registered(c, layout, x0);
  ASSERT_NE(shard, nullptr);
  auto push = [&](uint32_t w, uint64_t t, float value) {
    std::vector<float> g = Gradient(kN, w, t, 0.1f);
    for (uint64_t i = 768; i < kN; ++i) g[i] = w == 0 ? value + 0.1f * i : 0;
    return shard->Push(PushRequestFor(w, t, Fp32Tensor(g)));
  };
  for (uint32_t w = 0; w < 3; ++w) ASSERT_TRUE(push(w, 0, 1.7f).ok());
  std::vector<float> x = Snapshot(*shard, 1);
  for (uint64_t i = 768; i < kN; ++i) {
    ASSERT_EQ(x[i], 1.7f + 0.1f * i) << i;
  }
  // The parameters still step with the mean.
  const std::vector<float> g0 = Gradient(kN, 0, 0, 0.1f),
                           g1 = Gradient(kN, 1, 0, 0.1f),
                           g2 = Gradient(kN, 2, 0, 0.1f);
  EXPECT_NEAR(x[5], x0[5] - (g0[5] + g1[5] + g2[5]) / 3, 1e-6);
  // Under ssp the layout is refused.
  ShardConfig ssp = testing_util::ExactSgdConfig(2);
  ssp.consistency.mode = Consistency::kSsp;
  ssp.consistency.max_staleness = 1;
  absl::StatusOr<std::unique_ptr<Shard>> relaxed = Shard::Create(ssp, nullptr);
  ASSERT_TRUE(relaxed.ok());
  v1::RegisterRequest r = testing_util::RegisterRequestFor(0, 2, x0);
  *r.mutable_layout() = layout;
  absl::Status refused = (*relaxed)->Register(r).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("is a broadcast buffer"),
            std::string::npos) << refused;
}

TEST(ShardHyper, ARoundWithoutWorkerZeroLeavesBroadcastBuffersAsTheyWere) {
  FakeClock clock;
  ShardConfig c = testing_util::ExactSgdConfig(2);
  c.lease_timeout = absl::Milliseconds(300);
  ShardEnv env;
  env.clock = &clock;
  absl::StatusOr<std::unique_ptr<Shard>> made = Shard::Create(c, env);
  ASSERT_TRUE(made.ok()) << made.status();
  Shard& shard = **made;
  v1::ModelLayout layout = testing_util::SmallLayout();
  layout.mutable_tensors(1)->set_kind(v1::TENSOR_KIND_BROADCAST_BUFFER);
  const std::vector<float> x0 = InitialWeights(kN);
  for (uint32_t w = 0; w < 2; ++w) {
    v1::RegisterRequest r = testing_util::RegisterRequestFor(w, 2, x0);
    *r.mutable_layout() = layout;
    ASSERT_TRUE(shard.Register(r).ok());
  }
  auto push = [&](uint32_t w, uint64_t t) {
    std::vector<float> g(kN, 0.01f);
    for (uint64_t i = 768; i < kN; ++i) g[i] = w == 0 ? 5.0f : 0.0f;
    return shard.Push(PushRequestFor(w, t, Fp32Tensor(g)));
  };
  ASSERT_TRUE(push(0, 0).ok());
  ASSERT_TRUE(push(1, 0).ok());
  ASSERT_EQ(Snapshot(shard, 1)[800], 5.0f);
  // Round 1: worker 0 is silent past its lease; the round goes on without
  // it, and the buffer keeps worker 0's last values instead of the zeros.
  ASSERT_TRUE(push(1, 1).ok());
  clock.Advance(absl::Milliseconds(301));
  shard.CheckLeases();
  ASSERT_EQ(shard.Status().current_step(), 2u);
  absl::StatusOr<v1::PullResponse> r = shard.PullBlocking(
      PullRequestFor(1, 2, -1, 0, /*want_snapshot=*/true), absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<float> x = DecodeAll(r->weights());
  ASSERT_EQ(x.size(), kN);
  for (uint64_t i = 768; i < kN; ++i) ASSERT_EQ(x[i], 5.0f) << i;
  EXPECT_FLOAT_EQ(x[0], x0[0] - 0.02f);  // the parameters stepped twice
}
}  // namespace
}  // namespace pserver
