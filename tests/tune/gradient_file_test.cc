// The gradient capture file (tune/gradient_file.h): round trips through
// the writer and reader, and the reader on untrusted bytes (cut short,
// corrupted, or well-formed records with fields out of range).
#include "tune/gradient_file.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/record_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

v1::ModelLayout TwoTensors() {
  v1::ModelLayout layout;
  v1::TensorSpec* w = layout.add_tensors();
  w->set_name("fc1.weight");
  w->add_shape(3);
  w->add_shape(2);
  v1::TensorSpec* b = layout.add_tensors();
  b->set_name("fc1.bias");
  b->add_shape(4);
  return layout;
}

std::vector<float> Gradient(uint64_t step) {
  std::vector<float> g(10);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * i - 1.0f * step;
  return g;
}

// Writes `steps` captured steps to a file and returns its bytes; *ends gets
// the byte offset where each frame ends.
std::string WriteSample(const std::vector<uint64_t>& steps,
                        std::vector<size_t>* ends = nullptr) {
  const std::string dir = testing_util::MakeTempDir("gradient_file");
  const std::string path = dir + "/g.bin";
  auto w = GradientFileWriter::Create(path, TwoTensors(), 3);
  EXPECT_TRUE(w.ok()) << w.status();
  for (uint64_t s : steps) EXPECT_TRUE((*w)->Append(s, Gradient(s)).ok());
  EXPECT_TRUE((*w)->Close().ok());
  std::string bytes;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
  std::fclose(f);
  if (ends != nullptr) {
    ends->clear();
    size_t at = 0;
    while (at + 8 <= bytes.size()) {
      uint64_t len = 0;
      for (int i = 7; i >= 0; --i) {
        len = (len << 8) | static_cast<unsigned char>(bytes[at + i]);
      }
      at += 8 + len;
      ends->push_back(at);
    }
  }
  return bytes;
}

std::string Frame(const std::string& record) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(uint64_t{record.size()} >> (8 * i)));
  }
  return out + record;
}

// A header record with the given fields (valid checksum).
std::string Header(uint32_t version, uint32_t worker, uint32_t count,
                   const std::vector<std::pair<std::string,
                                               std::vector<int64_t>>>& t) {
  RecordWriter w("PSGRADH1");
  w.Num<uint32_t>(version);
  w.Num<uint32_t>(worker);
  w.Num<uint32_t>(count);
  for (const auto& [name, shape] : t) {
    w.Blob(name);
    w.Int64s(shape);
  }
  return Frame(std::move(w).Finish());
}

std::string GoodHeader() {
  return Header(1, 3, 2, {{"a", {3, 2}}, {"b", {4}}});
}

std::string Step(uint64_t step, uint32_t worker,
                 const std::vector<std::vector<float>>& tensors,
                 uint32_t count = 2) {
  RecordWriter w("PSGRADS1");
  w.Num<uint64_t>(step);
  w.Num<uint32_t>(worker);
  w.Num<uint32_t>(count);
  for (const auto& v : tensors) w.Floats(v);
  return Frame(std::move(w).Finish());
}

std::vector<std::vector<float>> GoodValues() {
  return {std::vector<float>(6, 1.0f), std::vector<float>(4, 2.0f)};
}

TEST(GradientFile, RoundTripKeepsLayoutStepsAndValues) {
  const std::string bytes = WriteSample({0, 1, 7});
  absl::StatusOr<GradientCapture> c = ParseGradientFile(bytes);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_id, 3u);
  ASSERT_EQ(c->layout.tensors_size(), 2);
  EXPECT_EQ(c->layout.tensors(0).name(), "fc1.weight");
  EXPECT_THAT(c->layout.tensors(0).shape(), ::testing::ElementsAre(3, 2));
  ASSERT_EQ(c->slots.size(), 2u);
  EXPECT_EQ(c->slots[1].offset, 6u);
  ASSERT_EQ(c->steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const uint64_t s = std::vector<uint64_t>{0, 1, 7}[i];
    EXPECT_EQ(c->steps[i].step, s);
    EXPECT_EQ(c->steps[i].values, Gradient(s));
  }
  absl::Span<const float> bias = TensorValues(*c, c->steps[2], 1);
  ASSERT_EQ(bias.size(), 4u);
  EXPECT_EQ(bias[0], Gradient(7)[6]);
}

TEST(GradientFile, ReadsFromDiskAndNamesAMissingPath) {
  const std::string dir = testing_util::MakeTempDir("gradient_file");
  const std::string path = dir + "/g.bin";
  auto w = GradientFileWriter::Create(path, TwoTensors(), 0);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(5, Gradient(5)).ok());
  ASSERT_TRUE((*w)->Close().ok());
  absl::StatusOr<GradientCapture> c = ReadGradientFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps.size(), 1u);

  absl::StatusOr<GradientCapture> missing = ReadGradientFile(dir + "/nope");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));

  GradientFileLimits small;
  small.max_file_bytes = 100;
  absl::StatusOr<GradientCapture> big = ReadGradientFile(path, small);
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
}

TEST(GradientFile, WriterChecksItsInput) {
  const std::string dir = testing_util::MakeTempDir("gradient_file");
  auto w = GradientFileWriter::Create(dir + "/g.bin", TwoTensors(), 0);
  ASSERT_TRUE(w.ok());
  absl::Status s = (*w)->Append(0, std::vector<float>(9));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("9 elements; expected 10"));
  ASSERT_TRUE((*w)->Append(4, Gradient(4)).ok());
  s = (*w)->Append(4, Gradient(4));
  EXPECT_THAT(s.message(), HasSubstr("step is 4; expected > 4"));
  EXPECT_EQ((*w)->steps_written(), 1u);
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_FALSE((*w)->Append(5, Gradient(5)).ok());

  auto nowhere =
      GradientFileWriter::Create(dir + "/no/such/dir/g.bin", TwoTensors(), 0);
  EXPECT_TRUE(absl::IsUnavailable(nowhere.status())) << nowhere.status();
  EXPECT_THAT(nowhere.status().message(), HasSubstr("no/such/dir/g.bin"));

  v1::ModelLayout bad = TwoTensors();
  bad.mutable_tensors(1)->set_name("fc1.weight");
  EXPECT_TRUE(absl::IsInvalidArgument(
      GradientFileWriter::Create(dir + "/b.bin", bad, 0).status()));
}

// A file cut at a frame boundary holds fewer steps; cut anywhere else it is
// refused as truncated, naming the frame.
TEST(GradientFile, EveryTruncationIsDetectedOrEndsAtAStep) {
  std::vector<size_t> ends;
  const std::string bytes = WriteSample({0, 1, 2}, &ends);
  ASSERT_EQ(ends.size(), 4u);
  ASSERT_EQ(ends.back(), bytes.size());
  for (size_t len = 0; len < bytes.size(); ++len) {
    absl::StatusOr<GradientCapture> c =
        ParseGradientFile(absl::string_view(bytes).substr(0, len));
    size_t whole = 0;
    while (whole < ends.size() && ends[whole] <= len) ++whole;
    if (whole > 0 && ends[whole - 1] == len) {
      ASSERT_TRUE(c.ok()) << len << ": " << c.status();
      EXPECT_EQ(c->steps.size(), whole - 1);
    } else {
      ASSERT_FALSE(c.ok()) << len;
      EXPECT_TRUE(absl::IsDataLoss(c.status())) << len << ": " << c.status();
      EXPECT_THAT(c.status().message(),
                  HasSubstr(absl::StrCat("frame ", whole)));
    }
  }
}

TEST(GradientFile, EveryFlippedBitIsDetected) {
  const std::string bytes = WriteSample({0, 1});
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      absl::StatusOr<GradientCapture> c = ParseGradientFile(bad);
      EXPECT_FALSE(c.ok()) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(GradientFile, FieldsOutOfRangeAreNamed) {
  struct Case {
    std::string bytes;
    absl::StatusCode code;
    std::string message;
  };
  const std::string h = GoodHeader();
  const std::vector<Case> cases = {
      {"", absl::StatusCode::kDataLoss, "frame 0 at byte 0: 0 bytes left"},
      {Frame("junk"), absl::StatusCode::kDataLoss, "not a gradient file header"},
      {Header(2, 3, 2, {{"a", {3, 2}}, {"b", {4}}}),
       absl::StatusCode::kInvalidArgument, "version is 2; expected 1"},
      {Header(1, 3, 0, {}), absl::StatusCode::kInvalidArgument,
       "tensor count is 0; expected 1..4096"},
      // A count far beyond what the record holds: refused, nothing reserved.
      {Header(1, 3, 4000, {{"a", {3}}}), absl::StatusCode::kInvalidArgument,
       "record ends before"},
      {Header(1, 3, 1, {{"", {3}}}), absl::StatusCode::kInvalidArgument,
       "tensors[0].name is 0 bytes; expected 1..256"},
      {Header(1, 3, 1, {{std::string(300, 'x'), {3}}}),
       absl::StatusCode::kInvalidArgument, "tensors[0].name is 300 bytes"},
      {Header(1, 3, 1, {{"a", {3, 0}}}), absl::StatusCode::kInvalidArgument,
       "tensors[0].shape[1] is 0; expected 1.."},
      {Header(1, 3, 1, {{"a", {-3}}}), absl::StatusCode::kInvalidArgument,
       "tensors[0].shape[0] is -3"},
      {Header(1, 3, 1, {{"a", {1, 1, 1, 1, 1, 1, 1, 1, 1}}}),
       absl::StatusCode::kInvalidArgument, "has 9 dimensions; expected at most 8"},
      {Header(1, 3, 1, {{"a", {int64_t{1} << 20, int64_t{1} << 20}}}),
       absl::StatusCode::kInvalidArgument, "layout"},
      {Header(1, 3, 2, {{"a", {3}}, {"a", {4}}}),
       absl::StatusCode::kInvalidArgument, "header (frame 0)"},
      {h + Step(0, 3, {std::vector<float>(6), std::vector<float>(3)}),
       absl::StatusCode::kInvalidArgument,
       "step record 0 (frame 1): tensors[1] (b) has 3 values; expected 4"},
      {h + Step(0, 4, GoodValues()), absl::StatusCode::kInvalidArgument,
       "worker_id is 4; expected 3 (the header's)"},
      {h + Step(0, 3, GoodValues(), 3), absl::StatusCode::kInvalidArgument,
       "tensor count is 3; expected 2"},
      {h + Step(5, 3, GoodValues()) + Step(5, 3, GoodValues()),
       absl::StatusCode::kInvalidArgument,
       "step record 1 (frame 2): step is 5; expected > 5"},
      {h + Step(0, 3, {std::vector<float>(6)}),
       absl::StatusCode::kInvalidArgument,
       "record ends before tensors[1] (b) values"},
      // Too short for the layout's values: refused before the checksum pass.
      {h + Frame(std::string("PSGRADS1") + std::string(10, '\0')),
       absl::StatusCode::kInvalidArgument, "18 bytes; expected at least 40"},
      {h + Frame(std::string(64, 'z')), absl::StatusCode::kDataLoss,
       "not a gradient file step record"},
      {h + std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8),
       absl::StatusCode::kDataLoss, "frame 1 at byte"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GradientCapture> r = ParseGradientFile(c.bytes);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.message));
  }
  // The good pieces parse, so the cases above fail for their own field.
  absl::StatusOr<GradientCapture> ok =
      ParseGradientFile(h + Step(0, 3, GoodValues()) + Step(9, 3, GoodValues()));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->steps.size(), 2u);
}

TEST(GradientFile, LimitsAreEnforced) {
  const std::string bytes = WriteSample({0, 1, 2});
  GradientFileLimits l;
  l.max_steps = 2;
  absl::StatusOr<GradientCapture> c = ParseGradientFile(bytes, l);
  EXPECT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("expected at most 2"));
  l = {};
  l.max_elements = 9;
  c = ParseGradientFile(bytes, l);
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("expected at most 9"));
  l = {};
  l.max_tensors = 1;
  c = ParseGradientFile(bytes, l);
  EXPECT_THAT(c.status().message(), HasSubstr("tensor count is 2; expected 1..1"));
}

TEST(StepRanges, ParsesRangesAndSingleSteps) {
  absl::StatusOr<StepRanges> r = StepRanges::Parse("0-2,10,20-21");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->last(), 21u);
  std::vector<uint64_t> in;
  for (uint64_t s = 0; s < 30; ++s) {
    if (r->Contains(s)) in.push_back(s);
  }
  EXPECT_EQ(in, (std::vector<uint64_t>{0, 1, 2, 10, 20, 21}));
}

TEST(StepRanges, BadSpecsNameThePart) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "is empty"},
      {"x", "has 'x'"},
      {"1-", "has '1-'"},
      {"-3", "has '-3'"},
      {"+3", "has '+3'"},
      {"5-2", "ends before it starts"},
      {"0-9,5-12", "does not start after step 9"},
      {"3,3", "does not start after step 3"},
      {"1,,2", "has ''"},
      {"1-2-3", "has '1-2-3'"},
      {"99999999999999999999999", "has '9999"},
  };
  for (const auto& [spec, message] : bad) {
    absl::StatusOr<StepRanges> r = StepRanges::Parse(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    EXPECT_THAT(r.status().message(), HasSubstr(message)) << spec;
  }
}

}  // namespace
}  // namespace pserver
