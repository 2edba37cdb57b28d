// The auto-tuner's choice (tune/codec_tuner.h) on profiles built by hand,
// where the right answer is known, and once end to end on measured ones.
#include "tune/codec_tuner.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

// Candidate list of the hand-made cases: fp32 first, then lossy codecs whose
// figures each test gives.
std::vector<CodecCandidate> Candidates(int lossy) {
  std::vector<CodecCandidate> c;
  c.push_back({"fp32", "float", v1::CODEC_FP32, {}});
  for (int i = 0; i < lossy; ++i) {
    v1::CodecParams p;
    p.set_bits(8 - 2 * i);
    p.set_range(v1::QUANTIZE_RANGE_ADAPTIVE);
    c.push_back(
        {"q" + std::to_string(8 - 2 * i), "quantize", v1::CODEC_QUANTIZE, p});
  }
  return c;
}

// A profile over `steps` steps with `bytes` per step and a window error
// ||e_W|| = rel * ||sum g||, ||sum g||^2 = g_sq.
CodecProfile Profile(uint64_t elements, double bytes, double rel,
                     double g_sq = 1.0, size_t steps = 2) {
  CodecProfile p;
  p.elements = elements;
  p.bytes.assign(steps, static_cast<uint64_t>(bytes));
  p.ef_bytes.assign(steps, static_cast<uint64_t>(bytes));
  p.g_sq.assign(steps, g_sq);
  p.err_sq.assign(steps, g_sq * rel * rel * 4);
  p.ef_err_sq.assign(steps, g_sq * rel * rel);
  p.window_g_sq = g_sq;
  p.window_err_sq = g_sq * rel * rel * 4;
  p.ef_window_err_sq = g_sq * rel * rel;
  return p;
}

// A tensor whose candidate c (after fp32) has bytes bytes[c] and relative
// error rel[c], on one window.
TensorMeasurement Tensor(const std::string& name, uint64_t elements,
                         const std::vector<double>& bytes,
                         const std::vector<double>& rel, double g_sq = 1.0) {
  TensorMeasurement m;
  m.name = name;
  m.elements = elements;
  m.profiles.push_back({Profile(elements, 4.0 * elements, 0, g_sq)});
  for (size_t c = 0; c < bytes.size(); ++c) {
    m.profiles.push_back({Profile(elements, bytes[c], rel[c], g_sq)});
  }
  return m;
}

TunerOptions Target(double e) {
  TunerOptions o;
  o.target_error = e;
  return o;
}

TunerOptions Budget(double b) {
  TunerOptions o;
  o.budget_bytes = b;
  return o;
}

// Every candidate's bytes and EF window error on a 10000-element tensor.
const std::vector<double> kBytes = {10000, 5000, 2500};
const std::vector<double> kRel = {0.01, 0.05, 0.3};

TEST(CodecTuner, TargetPicksTheCheapestWithinTheError) {
  const auto c = Candidates(3);
  const std::vector<TensorMeasurement> m = {Tensor("w", 10000, kBytes, kRel)};
  for (auto [target, want] : std::vector<std::pair<double, size_t>>{
           {0.02, 1}, {0.06, 2}, {0.2, 2}, {0.5, 3}}) {
    absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Target(target));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tensors[0].chosen, want) << "target " << target;
    EXPECT_EQ(r->tensors[0].reason, "within target");
    EXPECT_EQ(r->bytes, kBytes[want - 1]);
    EXPECT_DOUBLE_EQ(r->ef_window_error, kRel[want - 1]);
    EXPECT_DOUBLE_EQ(r->error, 2 * kRel[want - 1]);  // Profile()'s no-EF error
  }
}

TEST(CodecTuner, TargetBelowEveryLossyErrorFallsBackToFp32) {
  const auto c = Candidates(3);
  const std::vector<TensorMeasurement> m = {Tensor("w", 10000, kBytes, kRel)};
  absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Target(1e-6));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 0u);
  EXPECT_EQ(r->tensors[0].choice().ef_window_error, 0.0);
  EXPECT_EQ(r->bytes, 40000.0);
}

TEST(CodecTuner, TinyTensorsStayDense) {
  const auto c = Candidates(3);
  // 1024 elements are 4096 fp32 bytes (dense); 1025 are not.
  const std::vector<TensorMeasurement> m = {
      Tensor("bias", 1024, {1024, 512, 256}, kRel),
      Tensor("w", 1025, {1025, 513, 257}, kRel)};
  absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Target(0.5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 0u);
  EXPECT_EQ(r->tensors[0].reason, "dense");
  EXPECT_EQ(r->tensors[1].chosen, 3u);

  TunerOptions o = Target(0.5);
  o.dense_below_bytes = 0;
  r = TuneCodecs(c, m, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 3u);

  // Under a budget too.
  TunerOptions b = Budget(1e9);
  r = TuneCodecs(c, m, b);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 0u);
}

TEST(CodecTuner, CandidatesSavingLessThanATenthAreIgnored) {
  const auto c = Candidates(2);
  // 10000 elements, 40000 fp32 bytes: 37000 saves 7.5%, 35000 saves 12.5%.
  std::vector<TensorMeasurement> m = {
      Tensor("w", 10000, {37000, 36500}, {0.01, 0.02})};
  absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Target(0.5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 0u);
  EXPECT_FALSE(r->tensors[0].candidates[1].eligible);

  m = {Tensor("w", 10000, {37000, 35000}, {0.01, 0.02})};
  r = TuneCodecs(c, m, Target(0.5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 2u);
}

// Sum of the chosen candidates' absolute squared errors.
double TotalErrSq(const TuneResult& r) {
  double e = 0;
  for (const TensorChoice& t : r.tensors) e += t.choice().ef_err_sq;
  return e;
}

std::vector<TensorMeasurement> MixedModel() {
  // Three tensors of different sizes and gradient norms; candidates: q8
  // (1 byte per element), q4 (half), q2 (quarter).
  std::vector<TensorMeasurement> m;
  const uint64_t n[] = {100000, 100000, 80000};
  const double g_sq[] = {100.0, 1.0, 1.0};
  const char* names[] = {"a", "b", "c"};
  for (int t = 0; t < 3; ++t) {
    const double e = static_cast<double>(n[t]);
    m.push_back(
        Tensor(names[t], n[t], {e, e / 2, e / 4}, {0.01, 0.1, 0.4}, g_sq[t]));
  }
  return m;
}

TEST(CodecTuner, BudgetIsRespectedAndMoreBytesNeverErrMore) {
  const auto c = Candidates(3);
  const std::vector<TensorMeasurement> m = MixedModel();
  double last = INFINITY;
  // From the cheapest encoding (70000 bytes) to everything fp32 (1120000).
  std::vector<double> budgets;
  for (double b = 70000; b < 1120000; b *= 1.3) budgets.push_back(b);
  budgets.push_back(1120000);
  for (double budget : budgets) {
    absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Budget(budget));
    ASSERT_TRUE(r.ok()) << r.status();
    double bytes = 0;
    for (const TensorChoice& t : r->tensors) bytes += t.choice().bytes;
    EXPECT_LE(bytes, budget);
    EXPECT_EQ(bytes, r->bytes);
    EXPECT_EQ(r->budget_bytes, budget);
    const double err = TotalErrSq(*r);
    EXPECT_LE(err, last) << "budget " << budget;
    last = err;
  }
  EXPECT_EQ(last, 0.0);  // everything fits in fp32 at the end
}

TEST(CodecTuner, BudgetBeatsTheBestUniformCodec) {
  const auto c = Candidates(3);
  const std::vector<TensorMeasurement> m = MixedModel();
  const double budget = 200000;
  absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Budget(budget));
  ASSERT_TRUE(r.ok()) << r.status();
  // The naive allocation: one codec for every tensor, the most accurate
  // that fits.
  double uniform = INFINITY;
  for (size_t k = 0; k < c.size(); ++k) {
    double bytes = 0, err = 0;
    for (const TensorMeasurement& t : m) {
      bytes += t.profiles[k][0].mean_ef_bytes();
      err += t.profiles[k][0].ef_window_err_sq;
    }
    if (bytes <= budget) uniform = std::min(uniform, err);
  }
  ASSERT_TRUE(std::isfinite(uniform));
  EXPECT_LT(TotalErrSq(*r), uniform / 2);
  // The big, loud tensor gets the bytes.
  EXPECT_EQ(r->tensors[0].chosen, 1u);
}

TEST(CodecTuner, UpgradesAlongTheHull) {
  const auto c = Candidates(3);
  // x: q4 barely helps over q2, q8 helps a lot, so x's hull goes q2 -> q8
  // at 1.25e-4 per byte; y's first step is worth 3e-5 per byte. Stepping
  // along the sorted points instead would spend the budget on y and q4 of x
  // (error 0.25 instead of 0.04).
  const std::vector<TensorMeasurement> m = {
      Tensor("x", 10000, {3000, 2000, 1000}, {0.01, 0.49, 0.5}),
      Tensor("y", 10000, {3000, 2000, 1000}, {0.05, 0.1, 0.2})};
  absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Budget(4000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 1u);
  EXPECT_EQ(r->tensors[1].chosen, 3u);
  EXPECT_NEAR(TotalErrSq(*r), 0.0001 + 0.04, 1e-12);
}

// The greedy alone strands a large tensor: the small loud one takes its
// cheap upgrades first, after which the large one's next step (+25000
// bytes) no longer fits, and the rest goes to the small one (error 2.5002).
// The knapsack's answer gives the large tensor its step (error 0.6).
TEST(CodecTuner, BudgetDoesNotStrandALargeTensor) {
  const auto c = Candidates(3);
  const std::vector<TensorMeasurement> m = {
      Tensor("large", 100000, {100000, 50000, 25000}, {0.01, 0.1, 0.5}, 10),
      Tensor("small", 10000, {10000, 5000, 2500}, {0.01, 0.1, 0.5}, 2)};
  absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Budget(53000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 2u);
  EXPECT_EQ(r->tensors[1].chosen, 3u);
  EXPECT_NEAR(TotalErrSq(*r), 0.6, 1e-9);
  EXPECT_LE(r->bytes, 53000.0);
}

TEST(CodecTuner, ImpossibleBudgetNamesBudgetAndMinimum) {
  const auto c = Candidates(3);
  const std::vector<TensorMeasurement> m = MixedModel();
  absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Budget(69999));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(r.status().message(), HasSubstr("budget of 69999 bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("70000 bytes per step"));
  EXPECT_TRUE(TuneCodecs(c, m, Budget(70000)).ok());
}

TEST(CodecTuner, Deterministic) {
  const auto c = Candidates(3);
  // Two candidates with equal figures: the earlier one wins.
  const std::vector<TensorMeasurement> m = {
      Tensor("w", 10000, {5000, 5000, 2500}, {0.05, 0.05, 0.3})};
  for (int run = 0; run < 3; ++run) {
    absl::StatusOr<TuneResult> r = TuneCodecs(c, m, Target(0.1));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->tensors[0].chosen, 1u);
    r = TuneCodecs(c, m, Budget(5000));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->tensors[0].chosen, 1u);
  }
  absl::StatusOr<TuneResult> a = TuneCodecs(c, MixedModel(), Budget(150000));
  absl::StatusOr<TuneResult> b = TuneCodecs(c, MixedModel(), Budget(150000));
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t t = 0; t < a->tensors.size(); ++t) {
    EXPECT_EQ(a->tensors[t].chosen, b->tensors[t].chosen);
  }
}

TEST(CodecTuner, WorstWindowCounts) {
  const auto c = Candidates(1);
  TensorMeasurement m;
  m.name = "w";
  m.elements = 10000;
  m.profiles = {{Profile(10000, 40000, 0), Profile(10000, 40000, 0)},
                {Profile(10000, 10000, 0.01), Profile(10000, 12000, 0.2)}};
  absl::StatusOr<TuneResult> r = TuneCodecs(c, {m}, Target(0.1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 0u);
  EXPECT_EQ(r->tensors[0].candidates[1].bytes, 12000.0);
  EXPECT_DOUBLE_EQ(r->tensors[0].candidates[1].ef_window_error, 0.2);
  r = TuneCodecs(c, {m}, Target(0.21));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors[0].chosen, 1u);
}

TEST(CodecTuner, RefusesBadOptionsAndInputs) {
  const auto c = Candidates(3);
  const std::vector<TensorMeasurement> m = {Tensor("w", 10000, kBytes, kRel)};
  TunerOptions both = Target(0.1);
  both.budget_bytes = 1000;
  EXPECT_EQ(TuneCodecs(c, m, both).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TuneCodecs(c, m, TunerOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(TuneCodecs(c, m, Target(-1)).ok());
  EXPECT_FALSE(TuneCodecs(c, m, Target(NAN)).ok());
  EXPECT_FALSE(TuneCodecs(c, m, Budget(INFINITY)).ok());
  // No fp32 among the candidates.
  const std::vector<CodecCandidate> lossy(c.begin() + 1, c.end());
  std::vector<TensorMeasurement> m3 = m;
  m3[0].profiles.erase(m3[0].profiles.begin());
  EXPECT_THAT(TuneCodecs(lossy, m3, Target(0.1)).status().message(),
              HasSubstr("fp32"));
  // Profiles of another candidate list.
  EXPECT_THAT(TuneCodecs(c, m3, Target(0.1)).status().message(),
              HasSubstr("expected 4"));
}

TEST(CodecTuner, BudgetBytesPerStep) {
  // 10 Gbit/s for 0.1 s, half of it: 62.5 MB.
  EXPECT_DOUBLE_EQ(BudgetBytesPerStep(10, 0.1, 0.5), 62.5e6);
}

TEST(CodecTuner, SelectCandidates) {
  absl::StatusOr<std::vector<CodecCandidate>> s =
      SelectCandidates("Topk 1%,quantize");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)[0].label, "fp32");  // added
  size_t quantize = 0;
  bool topk = false;
  for (const CodecCandidate& c : *s) {
    quantize += c.family == "quantize";
    topk |= c.label == "topk 1%";
  }
  EXPECT_TRUE(topk);
  EXPECT_EQ(quantize, 16u);  // 4 widths x 2 ranges x 2 roundings
  EXPECT_EQ(s->size(), 18u);
  s = SelectCandidates("topk 1%,zstd");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("'zstd'"));
  for (const CodecCandidate& c : DefaultTunerCandidates()) {
    EXPECT_TRUE(MakeCodec(c.codec, c.params).ok()) << c.label;
  }
  EXPECT_GE(DefaultTunerCandidates().size(), 15u);
}

// A capture held in memory: two tensors, steps 0-3 and 10-11.
GradientCapture SmallCapture() {
  GradientCapture c;
  v1::TensorSpec* w = c.layout.add_tensors();
  w->set_name("fc.weight");
  w->add_shape(64);
  w->add_shape(64);
  v1::TensorSpec* b = c.layout.add_tensors();
  b->set_name("fc.bias");
  b->add_shape(64);
  c.slots = *ValidateLayout(c.layout);
  for (uint64_t step : {0, 1, 2, 3, 10, 11}) {
    GradientStep s;
    s.step = step;
    for (size_t i = 0; i < 64 * 64 + 64; ++i) {
      s.values.push_back(std::sin(0.37 * i + step) * (1 + i % 7));
    }
    c.steps.push_back(std::move(s));
  }
  return c;
}

TEST(CodecTuner, SplitStepWindows) {
  const GradientCapture c = SmallCapture();
  absl::StatusOr<std::vector<StepWindow>> w = SplitStepWindows(c, 0);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0].end - (*w)[0].begin, 4u);
  EXPECT_EQ((*w)[1].begin, 4u);
  w = SplitStepWindows(c, 2);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->size(), 3u);
  w = SplitStepWindows(c, 3);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->size(), 1u);
  w = SplitStepWindows(c, 5);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("expected at most 4"));
}

TEST(CodecTuner, MeasuredEndToEndWritesAParsableSchedule) {
  const GradientCapture capture = SmallCapture();
  const std::vector<CodecCandidate> cands = DefaultTunerCandidates();
  ProfileOptions po;
  po.repetitions = 1;
  po.min_timed_seconds = 0;
  absl::StatusOr<std::vector<TensorMeasurement>> m =
      MeasureCandidates(capture, *SplitStepWindows(capture, 0), cands, po);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].profiles[0].size(), 2u);  // two windows
  absl::StatusOr<TuneResult> push = TuneCodecs(cands, *m, Target(0.05));
  ASSERT_TRUE(push.ok()) << push.status();
  EXPECT_EQ(push->tensors[1].reason, "dense");  // 256 bytes
  EXPECT_NE(cands[push->tensors[0].chosen].codec, v1::CODEC_FP32);
  EXPECT_LE(push->tensors[0].choice().ef_window_error, 0.05);
  EXPECT_LT(push->bytes, push->fp32_bytes);
  absl::StatusOr<TuneResult> pull = TuneCodecs(cands, *m, Budget(5000));
  ASSERT_TRUE(pull.ok()) << pull.status();
  EXPECT_LE(pull->bytes, 5000.0);

  const v1::CompressionSchedule s = TunedSchedule(cands, *push, &*pull);
  absl::StatusOr<std::string> json = ScheduleToJson(s);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"tensor\": \"fc.weight\""));
  absl::StatusOr<std::shared_ptr<const CompressionSchedule>> parsed =
      CompressionSchedule::Parse(*json, "tuned.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << *json;
  EXPECT_EQ((*parsed)->proto().SerializeAsString(), s.SerializeAsString());
  ASSERT_EQ(s.phases_size(), 1);
  EXPECT_EQ(s.phases(0).name(), "tuned");
  EXPECT_FALSE(s.phases(0).has_push());
  ASSERT_EQ(s.phases(0).tensors_size(), 2);
  EXPECT_EQ(s.phases(0).tensors(1).push().codec(), "fp32");
  EXPECT_TRUE(s.phases(0).tensors(1).has_pull());
  // Without deltas no pull entries.
  EXPECT_FALSE(
      TunedSchedule(cands, *push, nullptr).phases(0).tensors(0).has_pull());
}

}  // namespace
}  // namespace pserver
