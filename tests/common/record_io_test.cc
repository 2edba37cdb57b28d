#include "common/record_io.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

constexpr absl::string_view kMagic("TEST\0\1", 6);

std::string Sample() {
  RecordWriter w(kMagic);
  w.Num<uint8_t>(7);
  w.Num<uint32_t>(0x01020304u);
  w.Num<uint64_t>(0x1122334455667788ull);
  w.Num<int64_t>(-2);
  w.Num<float>(1.5f);
  w.Blob(std::string("a\0b", 3));
  w.Floats(std::vector<float>{0.5f, -1.0f});
  w.Int64s(std::vector<int64_t>{-1, 3});
  w.Floats({});
  return std::move(w).Finish();
}

TEST(RecordIo, RoundTrip) {
  const std::string bytes = Sample();
  absl::StatusOr<RecordReader> r = RecordReader::Open(bytes, kMagic, "test");
  ASSERT_TRUE(r.ok()) << r.status();
  uint8_t a = 0;
  uint32_t b = 0;
  uint64_t c = 0;
  int64_t d = 0;
  float e = 0;
  std::string blob;
  std::vector<float> f, empty{9.0f};
  std::vector<int64_t> i;
  ASSERT_TRUE(r->Num(&a) && r->Num(&b) && r->Num(&c) && r->Num(&d) &&
              r->Num(&e) && r->Blob(&blob) && r->Floats(&f) && r->Int64s(&i) &&
              r->Floats(&empty));
  EXPECT_TRUE(r->done());
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 0x01020304u);
  EXPECT_EQ(c, 0x1122334455667788ull);
  EXPECT_EQ(d, -2);
  EXPECT_EQ(e, 1.5f);
  EXPECT_EQ(blob, std::string("a\0b", 3));
  EXPECT_EQ(f, (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(i, (std::vector<int64_t>{-1, 3}));
  EXPECT_TRUE(empty.empty());
  EXPECT_FALSE(r->Num(&a));  // nothing left
}

// The byte layout is part of the checkpoint and state file formats.
TEST(RecordIo, LittleEndianLayoutAndTrailer) {
  RecordWriter w(kMagic);
  w.Num<uint32_t>(0x01020304u);
  w.Floats(std::vector<float>{1.0f});
  const std::string bytes = std::move(w).Finish();
  const std::string body = std::string(kMagic) +
                           std::string("\x04\x03\x02\x01", 4) +
                           std::string("\x01\0\0\0\0\0\0\0", 8) +
                           std::string("\0\0\x80\x3f", 4);
  ASSERT_EQ(bytes.size(), body.size() + 8);
  EXPECT_EQ(bytes.substr(0, body.size()), body);
  Checksum64 h;
  h.Update(body.data(), body.size());
  uint64_t sum = h.Finish();
  EXPECT_EQ(bytes.substr(body.size()),
            std::string(reinterpret_cast<const char*>(&sum), 8));
}

TEST(RecordIo, BadMagicAndEveryTruncationOrBitFlipAreDataLoss) {
  const std::string bytes = Sample();
  absl::StatusOr<RecordReader> r = RecordReader::Open(bytes, "OTHER!", "test");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("not a test"), std::string::npos);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_EQ(RecordReader::Open(bytes.substr(0, cut), kMagic, "test")
                  .status()
                  .code(),
              absl::StatusCode::kDataLoss)
        << cut;
  }
  for (size_t i = kMagic.size(); i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] ^= 0x04;
    absl::StatusOr<RecordReader> flipped = RecordReader::Open(b, kMagic, "test");
    EXPECT_EQ(flipped.status().code(), absl::StatusCode::kDataLoss) << i;
    EXPECT_NE(flipped.status().message().find("checksum mismatch"),
              std::string::npos);
  }
}

// A sealed record whose length fields claim more than it holds: every read
// fails, and nothing is allocated for the claimed sizes (the vectors stay
// small; a 2^61-element resize would throw or exhaust memory).
TEST(RecordIo, LengthsBeyondTheInputAreRefusedWithoutAllocating) {
  for (uint64_t claim : {uint64_t{3}, uint64_t{1} << 61,
                         std::numeric_limits<uint64_t>::max()}) {
    RecordWriter w(kMagic);
    w.Num<uint64_t>(claim);
    w.Num<uint32_t>(0);  // 4 bytes of "payload"
    const std::string bytes = std::move(w).Finish();
    for (int kind = 0; kind < 3; ++kind) {
      absl::StatusOr<RecordReader> r = RecordReader::Open(bytes, kMagic, "t");
      ASSERT_TRUE(r.ok());
      std::string s;
      std::vector<float> f;
      std::vector<int64_t> i;
      bool ok = kind == 0 ? r->Blob(&s) : kind == 1 ? r->Floats(&f) : r->Int64s(&i);
      if (claim == 3 && kind == 0) {
        EXPECT_TRUE(ok);  // 3 bytes fit in the 4 that follow
        continue;
      }
      if (claim == 3 && kind == 1) {
        EXPECT_FALSE(ok);  // 12 bytes do not
        EXPECT_EQ(f.size(), 0u);
        continue;
      }
      EXPECT_FALSE(ok) << claim << " " << kind;
      EXPECT_EQ(s.size() + f.size() + i.size(), 0u);
    }
  }
}

}  // namespace
}  // namespace pserver
