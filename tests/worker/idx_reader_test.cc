#include "worker/idx_reader.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/test_data.h"
#include "worker/rng.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
          static_cast<char>(v >> 8), static_cast<char>(v)};
}

// An IDX image file of `count` images whose pixel i of image n is
// (n * 7 + i) % 256.
std::string ImagesIdx(uint32_t count, uint32_t rows, uint32_t cols) {
  std::string s = BigEndian(0x00000803) + BigEndian(count) + BigEndian(rows) +
                  BigEndian(cols);
  for (uint32_t n = 0; n < count; ++n) {
    for (uint32_t i = 0; i < rows * cols; ++i) {
      s.push_back(static_cast<char>((n * 7 + i) % 256));
    }
  }
  return s;
}

std::string LabelsIdx(const std::vector<uint8_t>& labels) {
  std::string s = BigEndian(0x00000801) + BigEndian(labels.size());
  s.append(labels.begin(), labels.end());
  return s;
}

std::string Gzip(const std::string& raw) {
  // Level 1 is enough; the stream format is what matters.
  uLongf size = compressBound(raw.size()) + 64;
  std::string out;
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY),
            Z_OK);
  out.resize(size);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = raw.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = out.size();
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

class IdxReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/idx_reader_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : files_) std::remove(f.c_str());
    rmdir(dir_.c_str());
  }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    files_.push_back(path);
    return path;
  }

  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(IdxReaderTest, ReadsPlainImagesScaledToUnitInterval) {
  const std::string path = Write("img", ImagesIdx(3, 2, 5));
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->count, 3);
  EXPECT_EQ(images->rows, 2);
  EXPECT_EQ(images->cols, 5);
  ASSERT_EQ(images->pixels.size(), 30u);
  for (uint32_t n = 0; n < 3; ++n) {
    for (uint32_t i = 0; i < 10; ++i) {
      EXPECT_EQ(images->pixels[n * 10 + i],
                static_cast<float>((n * 7 + i) % 256) / 255.0f);
    }
  }
}

TEST_F(IdxReaderTest, GzipAndPlainGiveTheSameImages) {
  const std::string raw = ImagesIdx(40, 28, 28);
  absl::StatusOr<IdxImages> plain = ReadIdxImages(Write("plain", raw));
  absl::StatusOr<IdxImages> gz = ReadIdxImages(Write("gz.gz", Gzip(raw)));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(plain->pixels, gz->pixels);
  EXPECT_EQ(gz->pixels.back(), ((39 * 7 + 783) % 256) / 255.0f);
}

TEST_F(IdxReaderTest, ReadsLabels) {
  absl::StatusOr<std::vector<uint8_t>> labels =
      ReadIdxLabels(Write("lab.gz", Gzip(LabelsIdx({0, 9, 3, 3}))));
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(*labels, (std::vector<uint8_t>{0, 9, 3, 3}));
}

TEST_F(IdxReaderTest, MissingFileIsNotFound) {
  const std::string path = dir_ + "/nope.gz";
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(images.status().message(), HasSubstr(path));
  EXPECT_EQ(ReadIdxLabels(path).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(IdxReaderTest, DirectoryIsRejected) {
  EXPECT_EQ(ReadIdxImages(dir_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(IdxReaderTest, BadMagicIsInvalidArgument) {
  // A label file read as images, and the reverse.
  absl::Status s =
      ReadIdxImages(Write("lab", LabelsIdx({1, 2}))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("0x00000803"));
  s = ReadIdxLabels(Write("img.gz", Gzip(ImagesIdx(1, 2, 2)))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("0x00000801"));
  // Text that is not IDX at all.
  s = ReadIdxImages(Write("text", "hello, world, not an idx file")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IdxReaderTest, TruncatedHeaderIsDataLoss) {
  EXPECT_EQ(ReadIdxImages(Write("empty", "")).status().code(),
            absl::StatusCode::kDataLoss);
  const std::string header = ImagesIdx(2, 2, 2).substr(0, 10);
  EXPECT_EQ(ReadIdxImages(Write("short", header)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(IdxReaderTest, TruncatedDataIsDataLoss) {
  std::string raw = ImagesIdx(3, 4, 4);
  raw.resize(raw.size() - 5);
  for (const std::string& path :
       {Write("t", raw), Write("t.gz", Gzip(raw))}) {
    absl::Status s = ReadIdxImages(path).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr("48 bytes"));
  }
  std::string labels = LabelsIdx({1, 2, 3});
  labels.pop_back();
  EXPECT_EQ(ReadIdxLabels(Write("l", labels)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(IdxReaderTest, TrailingBytesAreInvalidArgument) {
  EXPECT_EQ(ReadIdxImages(Write("x", ImagesIdx(2, 3, 3) + "junk"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(IdxReaderTest, AbsurdDimensionsAreRejectedBeforeAllocating) {
  // 4 billion images of 64k x 64k: the header alone must be refused.
  const std::string huge = BigEndian(0x00000803) + BigEndian(0xFFFFFFFF) +
                           BigEndian(0xFFFF) + BigEndian(0xFFFF) + "abc";
  absl::Status s = ReadIdxImages(Write("huge", huge)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Plausible but far larger than the file: fails as truncated, after
  // reading only what is there.
  const std::string big = BigEndian(0x00000803) + BigEndian(100000) +
                          BigEndian(28) + BigEndian(28) + "abc";
  s = ReadIdxImages(Write("big.gz", Gzip(big))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A zero dimension.
  s = ReadIdxImages(Write("zero", ImagesIdx(0, 28, 28))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_F(IdxReaderTest, CorruptGzipIsDataLoss) {
  const std::string gz = Gzip(ImagesIdx(50, 28, 28));
  ASSERT_GT(gz.size(), 200u);
  // Flipped bits in the deflate stream.
  std::string flipped = gz;
  for (size_t i = 30; i < 60; ++i) flipped[i] ^= 0x5A;
  absl::Status s = ReadIdxImages(Write("flip.gz", flipped)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // A compressed file cut in half.
  s = ReadIdxImages(Write("half.gz", gz.substr(0, gz.size() / 2))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // Only the CRC-32 of the trailer wrong: every data byte decodes.
  std::string crc = gz;
  crc[crc.size() - 8] ^= 0x01;
  s = ReadIdxImages(Write("crc.gz", crc)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  // Gzip magic followed by garbage.
  s = ReadIdxImages(Write("garbage.gz", std::string("\x1f\x8b\x08\x00", 4) +
                                            std::string(100, '\xee')))
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(IdxReaderTest, LabelOutOfRangeIsInvalidArgument) {
  absl::Status s = ReadIdxLabels(Write("l", LabelsIdx({0, 10, 2}))).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("index 1"));
  EXPECT_TRUE(ReadIdxLabels(Write("l2", LabelsIdx({0, 10, 2})), 11).ok());
}

TEST_F(IdxReaderTest, LoadFashionMnistChecksTheFilesAgree) {
  // Missing directory contents.
  absl::Status s = LoadFashionMnist(dir_, DataSplit::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("train-images-idx3-ubyte.gz"));

  // Uncompressed files are accepted; 3 images but 2 labels is not.
  Write("t10k-images-idx3-ubyte", ImagesIdx(3, 28, 28));
  Write("t10k-labels-idx1-ubyte.gz", Gzip(LabelsIdx({1, 2})));
  s = LoadFashionMnist(dir_, DataSplit::kTest).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("2 labels, expected 3"));

  Write("t10k-labels-idx1-ubyte.gz", Gzip(LabelsIdx({1, 2, 9})));
  absl::StatusOr<Dataset> ok = LoadFashionMnist(dir_, DataSplit::kTest);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size, 3);
  EXPECT_EQ(ok->features(), 784);
  EXPECT_EQ(ok->num_classes, 10);
  EXPECT_EQ(ok->labels, (std::vector<uint8_t>{1, 2, 9}));

  // Images of the wrong size.
  Write("train-images-idx3-ubyte.gz", Gzip(ImagesIdx(2, 27, 28)));
  Write("train-labels-idx1-ubyte", LabelsIdx({1, 2}));
  s = LoadFashionMnist(dir_, DataSplit::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("27 x 28"));
}

TEST_F(IdxReaderTest, RandomCorruptionNeverCrashes) {
  // Bit flips, overwritten bytes and truncations of valid plain and gzip
  // files: every outcome is a value or a status, never a crash.
  const std::string raw = ImagesIdx(6, 8, 8);
  const std::string gz = Gzip(raw);
  const std::string labels = LabelsIdx({1, 2, 3, 4, 5, 6});
  SplitMix64 rng(2024);
  int errors = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = trial % 3 == 0 ? raw : trial % 3 == 1 ? gz : labels;
    const int edits = 1 + static_cast<int>(rng.Uniform(4));
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng.Uniform(bytes.size());
      switch (rng.Uniform(3)) {
        case 0: bytes[at] ^= static_cast<char>(1 << rng.Uniform(8)); break;
        case 1: bytes[at] = static_cast<char>(rng.Uniform(256)); break;
        default: bytes.resize(at); break;
      }
      if (bytes.empty()) break;
    }
    const std::string path = Write("fuzz" + std::to_string(trial), bytes);
    absl::StatusOr<IdxImages> images = ReadIdxImages(path);
    absl::StatusOr<std::vector<uint8_t>> read_labels = ReadIdxLabels(path);
    if (images.ok()) {
      EXPECT_EQ(images->pixels.size(),
                static_cast<size_t>(images->count * images->rows * images->cols));
    } else {
      ++errors;
      EXPECT_THAT(images.status().message(), HasSubstr(path));
    }
    if (!read_labels.ok()) {
      EXPECT_THAT(read_labels.status().message(), HasSubstr(path));
    }
  }
  EXPECT_GT(errors, 150);
}

TEST(FashionMnist, RealFilesLoadWithBalancedClasses) {
  for (DataSplit split : {DataSplit::kTrain, DataSplit::kTest}) {
    const Dataset* data = testing_data::FashionMnist(split);
    if (data == nullptr) GTEST_SKIP() << "dataset-fashion-mnist not installed";
    const int64_t expected = split == DataSplit::kTrain ? 60000 : 10000;
    EXPECT_EQ(data->size, expected);
    EXPECT_EQ(data->rows, 28);
    EXPECT_EQ(data->cols, 28);
    ASSERT_EQ(data->images.size(), static_cast<size_t>(expected * 784));
    ASSERT_EQ(data->labels.size(), static_cast<size_t>(expected));
    // Fashion-MNIST has exactly N/10 examples of each class.
    std::array<int64_t, 10> histogram{};
    for (uint8_t label : data->labels) ++histogram[label];
    for (int c = 0; c < 10; ++c) EXPECT_EQ(histogram[c], expected / 10) << c;
    double sum = 0;
    float lo = 1, hi = 0;
    for (float p : data->images) {
      sum += p;
      lo = std::min(lo, p);
      hi = std::max(hi, p);
    }
    EXPECT_EQ(lo, 0.0f);
    EXPECT_EQ(hi, 1.0f);
    // The published mean pixel of Fashion-MNIST is 0.286.
    EXPECT_NEAR(sum / data->images.size(), 0.286, 0.003);
  }
}

}  // namespace
}  // namespace pserver
