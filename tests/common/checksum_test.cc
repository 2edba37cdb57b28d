#include "common/checksum.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pserver {
namespace {

uint64_t HashString(const std::string& s) {
  Checksum64 h;
  h.Update(s.data(), s.size());
  return h.Finish();
}

TEST(Checksum64, IncrementalEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 7 + 3));
  uint64_t whole = HashString(data);
  for (size_t cut : {0, 1, 7, 31, 32, 33, 64, 500, 999, 1000}) {
    Checksum64 h;
    h.Update(data.data(), cut);
    h.Update(data.data() + cut, data.size() - cut);
    EXPECT_EQ(h.Finish(), whole) << "cut at " << cut;
  }
}

TEST(Checksum64, DetectsSingleBitFlipsAndLength) {
  std::vector<float> v(1000, 1.5f);
  uint64_t base = ChecksumOf(v);
  for (size_t i : {0, 1, 499, 998, 999}) {
    std::vector<float> w = v;
    w[i] = std::nextafter(w[i], 2.0f);
    EXPECT_NE(ChecksumOf(w), base) << i;
  }
  EXPECT_NE(ChecksumOf(absl::MakeConstSpan(v).subspan(0, 999)), base);
  EXPECT_NE(HashString(""), HashString(std::string(1, '\0')));
}

TEST(Checksum64, StableAcrossRuns) {
  // The value is part of the wire contract (replica checksums): it must not
  // change between builds.
  EXPECT_EQ(HashString("pserver"), HashString("pserver"));
  std::vector<float> v = {1.0f, -2.0f, 3.5f};
  EXPECT_EQ(ChecksumOf(v), ChecksumOf(std::vector<float>{1.0f, -2.0f, 3.5f}));
}

}  // namespace
}  // namespace pserver
