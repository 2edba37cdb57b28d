#include "common/schedule.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

constexpr char kStaged[] = R"({
  "phases": [
    {"name": "early", "end_fraction": 0.1,
     "push": {"codec": "quantize", "params": {"bits": 8}},
     "pull": {"codec": "quantize", "params": {"bits": 8}}},
    {"name": "middle", "begin_fraction": 0.1, "end_fraction": 0.5,
     "push": {"codec": "quantize", "params": {"bits": 6,
              "rounding": "ROUNDING_STOCHASTIC"}}},
    {"name": "late", "begin_fraction": 0.5,
     "push": {"codec": "quantize", "params": {"bits": 4}}}
  ]
})";

std::shared_ptr<const CompressionSchedule> MustParse(const std::string& text) {
  auto s = CompressionSchedule::Parse(text, "test.json");
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : nullptr;
}

std::string ParseError(const std::string& text) {
  auto s = CompressionSchedule::Parse(text, "bad.json");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.status().message());
}

TEST(ScheduleTest, ParsesJsonAndResolvesFractions) {
  auto s = MustParse(kStaged);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->num_phases(), 3u);
  EXPECT_TRUE(s->uses_fractions());
  EXPECT_EQ(s->PhaseName(1), "middle");
  ASSERT_NE(s->push(1), nullptr);
  EXPECT_EQ(s->push(1)->codec, v1::CODEC_QUANTIZE);
  EXPECT_EQ(s->push(1)->encoder->params().bits(), 6u);
  EXPECT_EQ(s->push(1)->encoder->params().rounding(), v1::ROUNDING_STOCHASTIC);
  EXPECT_NE(s->pull(0), nullptr);
  EXPECT_EQ(s->pull(1), nullptr);  // the shard's --pull_codec

  auto r = ResolvedSchedule::Make(s, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->begin(0), 0u);
  EXPECT_EQ(r->begin(1), 100u);
  EXPECT_EQ(r->begin(2), 500u);
  EXPECT_EQ(r->PhaseAt(0), 0u);
  EXPECT_EQ(r->PhaseAt(99), 0u);
  EXPECT_EQ(r->PhaseAt(100), 1u);
  EXPECT_EQ(r->PhaseAt(499), 1u);
  EXPECT_EQ(r->PhaseAt(500), 2u);
  EXPECT_EQ(r->PhaseAt(1u << 30), 2u);  // past the end: the last phase

  auto none = ResolvedSchedule::Make(s, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("total_steps is 0"));
}

TEST(ScheduleTest, TextFormatEqualsJsonFingerprint) {
  auto json = MustParse(kStaged);
  auto text = MustParse(R"pb(
    phases {
      name: "early" end_fraction: 0.1
      push { codec: "quantize" params { bits: 8 } }
      pull { codec: "quantize" params { bits: 8 } }
    }
    phases {
      name: "middle" begin_fraction: 0.1 end_fraction: 0.5
      push { codec: "quantize"
             params { bits: 6 rounding: ROUNDING_STOCHASTIC } }
    }
    phases { name: "late" begin_fraction: 0.5
             push { codec: "quantize" params { bits: 4 } } }
  )pb");
  ASSERT_NE(json, nullptr);
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(json->fingerprint(), text->fingerprint());
  EXPECT_NE(json->fingerprint(), 0u);
  auto other = MustParse(R"({"phases": [{"push": {"codec": "bf16"}}]})");
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->fingerprint(), json->fingerprint());
}

TEST(ScheduleTest, StepBoundsNeedNoRunLength) {
  auto s = MustParse(R"({"phases": [
      {"push": {"codec": "bf16"}},
      {"begin_step": 600, "push": {"codec": "onebit"}}]})");
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->uses_fractions());
  auto r = ResolvedSchedule::Make(s, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->PhaseAt(599), 0u);
  EXPECT_EQ(r->PhaseAt(600), 1u);
  EXPECT_EQ(s->push(0)->Describe(), "bf16");
}

TEST(ScheduleTest, RefusesBadSchedulesNamingTheField) {
  EXPECT_THAT(ParseError("{}"), HasSubstr("has no phases"));
  EXPECT_THAT(ParseError(R"({"phases": [{"begin_step": 5}]})"),
              HasSubstr("expected the first phase to begin at step 0"));
  // Overlap and gap, in the same units and after resolution.
  EXPECT_THAT(ParseError(R"({"phases": [{"end_step": 100},
                                         {"begin_step": 90}]})"),
              HasSubstr("no overlap"));
  EXPECT_THAT(ParseError(R"({"phases": [{"end_step": 80},
                                         {"begin_step": 90}]})"),
              HasSubstr("no gap"));
  EXPECT_THAT(ParseError(R"({"phases": [{}, {"begin_step": 90},
                                         {"begin_step": 90}]})"),
              HasSubstr("expected phases in increasing order"));
  EXPECT_THAT(ParseError(R"({"phases": [{}, {}]})"),
              HasSubstr("phase 1: begin is missing"));
  EXPECT_THAT(ParseError(R"({"phases": [{}, {"begin_step": 5,
                                         "begin_fraction": 0.5}]})"),
              HasSubstr("both begin_step and begin_fraction"));
  EXPECT_THAT(ParseError(R"({"phases": [{}, {"begin_fraction": 1.5}]})"),
              HasSubstr("begin_fraction is 1.5; expected 0..1"));
  EXPECT_THAT(ParseError(R"({"phases": [{"end_step": 10}]})"),
              HasSubstr("the last phase ends at step 10"));
  // Codecs: unknown names, missing names, parameters out of range.
  EXPECT_THAT(ParseError(R"({"phases": [{"push": {"codec": "zip"}}]})"),
              HasSubstr("phase 0 push: codec name is \"zip\""));
  EXPECT_THAT(ParseError(R"({"phases": [{"pull": {"params": {"bits": 4}}}]})"),
              HasSubstr("phase 0 pull: codec is missing"));
  EXPECT_THAT(
      ParseError(R"({"phases": [{"name": "late", "push": {"codec": "quantize",
                    "params": {"bits": 9}}}]})"),
      HasSubstr("phase 0 (\"late\") push: "));
  // Unknown fields and malformed text are refused, not ignored.
  EXPECT_THAT(ParseError(R"({"phases": [{"bgin_step": 3}]})"),
              HasSubstr("not a valid schedule (JSON)"));
  EXPECT_THAT(ParseError("phases { bgin_step: 3 }"),
              HasSubstr("not a valid schedule (text format): line 1"));
  EXPECT_THAT(ParseError(std::string(kMaxScheduleFileBytes + 1, ' ')),
              HasSubstr("expected at most"));
}

TEST(ScheduleTest, PerTensorCodecs) {
  auto s = MustParse(R"({"phases": [
    {"name": "tuned", "push": {"codec": "onebit"},
     "tensors": [
       {"tensor": "b", "push": {"codec": "fp32"}},
       {"tensor": "c", "push": {"codec": "quantize", "params": {"bits": 4}},
        "pull": {"codec": "bf16"}}]},
    {"begin_step": 10}]})");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->has_tensor_codecs());
  EXPECT_TRUE(s->has_tensor_pulls());
  const std::vector<TensorSlot> slots = {
      {"a", 0, 300}, {"b", 300, 517}, {"c", 817, 77}};
  EXPECT_TRUE(s->CheckTensors(slots).ok());
  std::vector<const Codec*> push = s->TensorPushCodecs(0, slots);
  ASSERT_EQ(push.size(), 3u);
  EXPECT_EQ(push[0], nullptr);
  ASSERT_NE(push[1], nullptr);
  EXPECT_EQ(push[1]->id(), v1::CODEC_FP32);
  ASSERT_NE(push[2], nullptr);
  EXPECT_EQ(push[2]->params().bits(), 4u);
  std::vector<const Codec*> pull = s->TensorPullCodecs(0, slots);
  EXPECT_EQ(pull[1], nullptr);
  ASSERT_NE(pull[2], nullptr);
  EXPECT_EQ(pull[2]->id(), v1::CODEC_BF16);
  // Phase 1 has no per-tensor codecs.
  EXPECT_EQ(s->TensorPushCodecs(1, slots),
            std::vector<const Codec*>(3, nullptr));
  // A name that is not in the layout.
  const std::vector<TensorSlot> other = {{"a", 0, 300}, {"b", 300, 517}};
  absl::Status missing = s->CheckTensors(other);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(),
              HasSubstr("phase 0 (\"tuned\") tensors[1]: tensor \"c\" is "
                        "not in the model's layout; expected one of a, b"));
  // Without tensors entries.
  auto plain = MustParse(kStaged);
  EXPECT_FALSE(plain->has_tensor_codecs());
  EXPECT_TRUE(plain->CheckTensors({}).ok());
}

TEST(ScheduleTest, RefusesBadTensorEntries) {
  EXPECT_THAT(ParseError(R"({"phases": [{"tensors": [
                  {"push": {"codec": "fp32"}}]}]})"),
              HasSubstr("phase 0 tensors[0]: tensor is missing"));
  EXPECT_THAT(ParseError(R"({"phases": [{"tensors": [
                  {"tensor": "a", "push": {"codec": "fp32"}},
                  {"tensor": "a", "pull": {"codec": "bf16"}}]}]})"),
              HasSubstr("phase 0 tensors[1]: tensor \"a\" appears twice"));
  EXPECT_THAT(ParseError(R"({"phases": [{"tensors": [{"tensor": "a"}]}]})"),
              HasSubstr("neither push nor pull is set"));
  EXPECT_THAT(ParseError(R"({"phases": [{"tensors": [{"tensor": "a",
                  "push": {"codec": "quantize", "params": {"bits": 1}}}]}]})"),
              HasSubstr("phase 0 tensors[0] push: params.bits is 1"));
  EXPECT_THAT(ParseError(R"({"phases": [{"tensors": [{"tensor": "a",
                  "pull": {"codec": "gzip"}}]}]})"),
              HasSubstr("phase 0 tensors[0] pull: codec name is \"gzip\""));
  std::string many = R"({"phases": [{"tensors": [)";
  for (int i = 0; i <= kMaxTensorCodecs; ++i) {
    if (i > 0) many += ",";
    many += "{\"tensor\": \"t" + std::to_string(i) +
            "\", \"push\": {\"codec\": \"fp32\"}}";
  }
  many += "]}]}";
  EXPECT_THAT(ParseError(many), HasSubstr("tensors entries; expected at most"));
}

TEST(ScheduleTest, ResolutionRefusesEmptyPhases) {
  // 0.1 and 0.15 of 10 rounds are both round 1: the middle phase is empty.
  auto s = MustParse(R"({"phases": [{}, {"begin_fraction": 0.1},
                                    {"begin_fraction": 0.15}]})");
  ASSERT_NE(s, nullptr);
  auto r = ResolvedSchedule::Make(s, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("expected every phase to have at least one round"));
  EXPECT_TRUE(ResolvedSchedule::Make(s, 100).ok());
  // Mixed units are checked once resolved: step 50 ends where 0.4 of 100
  // begins only if they agree.
  auto mixed = MustParse(R"({"phases": [{"end_step": 50},
                                        {"begin_fraction": 0.4}]})");
  ASSERT_NE(mixed, nullptr);
  auto gap = ResolvedSchedule::Make(mixed, 100);
  ASSERT_FALSE(gap.ok());
  EXPECT_THAT(gap.status().message(), HasSubstr("no overlap"));
  EXPECT_TRUE(ResolvedSchedule::Make(mixed, 125).ok());
}

TEST(ScheduleTest, LoadReadsFilesAndNamesThePath) {
  const std::string path =
      ::testing::TempDir() + "/schedule_test_" + std::to_string(::getpid());
  {
    std::ofstream out(path);
    out << kStaged;
  }
  auto s = CompressionSchedule::Load(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->num_phases(), 3u);
  std::remove(path.c_str());
  auto missing = CompressionSchedule::Load(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr(path));
  auto dir = CompressionSchedule::Load(::testing::TempDir());
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace pserver
