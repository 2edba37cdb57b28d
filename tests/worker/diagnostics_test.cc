// worker/diagnostics.h on scripted series: each condition is found once
// when it starts, not while it lasts, again after it has cleared, and never
// on a healthy run.
#include "worker/diagnostics.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

// A healthy step: falling loss, a steady residual, compute-bound.
StepSample Healthy(int64_t step) {
  StepSample s;
  s.step = step;
  s.loss = 0.5 + 2.0 / (1.0 + 0.05 * step);
  s.gradient_norm = 1.0;
  s.residual_norm = 5.0;
  s.compute_seconds = 0.010;
  s.communication_seconds = 0.002;
  s.pushed_bytes = 1000;
  return s;
}

std::vector<DiagnosticKind> Feed(TrainingDiagnostics& d,
                                 const std::vector<StepSample>& steps) {
  std::vector<DiagnosticKind> kinds;
  for (const StepSample& s : steps) {
    for (const Finding& f : d.Observe(s)) kinds.push_back(f.kind);
  }
  return kinds;
}

TEST(TrainingDiagnostics, AHealthyRunFindsNothing) {
  TrainingDiagnostics d;
  std::vector<StepSample> steps;
  for (int64_t t = 0; t < 3000; ++t) steps.push_back(Healthy(t));
  EXPECT_TRUE(Feed(d, steps).empty());
  EXPECT_NEAR(d.residual_ratio(), 5.0, 1e-9);
  EXPECT_NEAR(d.communication_share(), 0.002 / 0.012, 1e-9);
  EXPECT_NEAR(d.push_bytes_per_second(), 1000 / 0.002, 1e-6);
}

TEST(TrainingDiagnostics, NonFiniteLossIsFoundOncePerOccurrence) {
  TrainingDiagnostics d;
  StepSample bad = Healthy(3);
  bad.loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<Finding> first = d.Observe(bad);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].kind, DiagnosticKind::kNonFiniteLoss);
  EXPECT_THAT(first[0].message, HasSubstr("Lower the learning rate"));
  EXPECT_TRUE(d.Observe(bad).empty());  // the same occurrence
  EXPECT_TRUE(d.Observe(Healthy(5)).empty());
  bad.loss = std::numeric_limits<double>::infinity();
  EXPECT_EQ(Feed(d, {bad}),
            std::vector<DiagnosticKind>{DiagnosticKind::kNonFiniteLoss});
}

TEST(TrainingDiagnostics, LossSpikeIsFoundWhenItStartsAndAfterRecovery) {
  TrainingDiagnostics d;
  std::vector<StepSample> steps;
  for (int64_t t = 0; t < 300; ++t) steps.push_back(Healthy(t));
  EXPECT_TRUE(Feed(d, steps).empty());
  // The loss jumps to 2.3 (its best EMA is ~0.6) and stays there.
  steps.clear();
  for (int64_t t = 300; t < 500; ++t) {
    StepSample s = Healthy(t);
    s.loss = 2.3;
    steps.push_back(s);
  }
  EXPECT_EQ(Feed(d, steps),
            std::vector<DiagnosticKind>{DiagnosticKind::kLossSpike});
  // Back to normal, then a second spike is a second occurrence.
  steps.clear();
  for (int64_t t = 500; t < 700; ++t) steps.push_back(Healthy(t));
  for (int64_t t = 700; t < 800; ++t) {
    StepSample s = Healthy(t);
    s.loss = 3.0;
    steps.push_back(s);
  }
  EXPECT_EQ(Feed(d, steps),
            std::vector<DiagnosticKind>{DiagnosticKind::kLossSpike});
}

TEST(TrainingDiagnostics, NoSpikeInTheFirstSteps) {
  // A loss that starts high and rises a little at first (the first
  // minibatches) is not a spike before warmup_steps.
  TrainingDiagnostics d;
  std::vector<StepSample> steps;
  for (int64_t t = 0; t < 40; ++t) {
    StepSample s = Healthy(t);
    s.loss = t < 10 ? 0.4 : 2.0;
    steps.push_back(s);
  }
  EXPECT_TRUE(Feed(d, steps).empty());
}

TEST(TrainingDiagnostics, GrowingResidualIsFoundButALargeSteadyOneIsNot) {
  DiagnosticsOptions o;
  TrainingDiagnostics steady(o);
  std::vector<StepSample> steps;
  for (int64_t t = 0; t < 1000; ++t) {
    StepSample s = Healthy(t);
    s.residual_norm = 40.0;  // large (TopK carries much) but bounded
    steps.push_back(s);
  }
  EXPECT_TRUE(Feed(steady, steps).empty());

  TrainingDiagnostics growing(o);
  steps.clear();
  for (int64_t t = 0; t < 1000; ++t) {
    StepSample s = Healthy(t);
    s.residual_norm = 5.0 + 0.2 * t;  // without bound
    steps.push_back(s);
  }
  std::vector<Finding> found;
  for (const StepSample& s : steps) {
    for (Finding& f : growing.Observe(s)) found.push_back(f);
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, DiagnosticKind::kResidualGrowth);
  EXPECT_THAT(found[0].message, HasSubstr("error-feedback residual"));
  EXPECT_GT(growing.residual_ratio(), o.residual_ratio);
  // Steps without a residual (the preconditioned stage) change nothing.
  StepSample unknown = Healthy(1000);
  unknown.residual_norm = -1;
  const double before = growing.residual_ratio();
  EXPECT_TRUE(growing.Observe(unknown).empty());
  EXPECT_EQ(growing.residual_ratio(), before);
}

TEST(TrainingDiagnostics, CommunicationBottleneckIsFoundAndRearmed) {
  TrainingDiagnostics d;
  auto slow = [](int64_t t) {
    StepSample s = Healthy(t);
    s.compute_seconds = 0.002;
    s.communication_seconds = 0.020;  // 91% of the step
    s.pushed_bytes = 2'000'000;
    return s;
  };
  std::vector<StepSample> steps;
  for (int64_t t = 0; t < 40; ++t) steps.push_back(slow(t));
  EXPECT_TRUE(Feed(d, steps).empty());  // before warmup_steps
  std::vector<Finding> found;
  for (int64_t t = 40; t < 200; ++t) {
    for (Finding& f : d.Observe(slow(t))) found.push_back(f);
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, DiagnosticKind::kCommunicationBottleneck);
  EXPECT_THAT(found[0].message, HasSubstr("waiting for the round take 9"));
  EXPECT_THAT(found[0].message, HasSubstr("pushes reach 100.0 MB/s"));
  steps.clear();
  for (int64_t t = 200; t < 400; ++t) steps.push_back(Healthy(t));
  for (int64_t t = 400; t < 600; ++t) steps.push_back(slow(t));
  EXPECT_EQ(Feed(d, steps), std::vector<DiagnosticKind>{
                                DiagnosticKind::kCommunicationBottleneck});
}

}  // namespace
}  // namespace pserver
