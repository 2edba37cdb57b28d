// PageBuffer: n zeros from the kernel, moved without copying, and its pages
// given back when released (the process's resident set shrinks at once).
#include "worker/page_buffer.h"

#include <unistd.h>

#include <fstream>
#include <utility>

#include "gtest/gtest.h"

namespace pserver {
namespace {

// The process's resident bytes (/proc/self/statm).
long ResidentBytes() {
  std::ifstream f("/proc/self/statm");
  long size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(PageBuffer, ZerosMovedAndReleased) {
  constexpr size_t kFloats = size_t{32} << 20;  // 128 MiB
  constexpr long kBytes = static_cast<long>(kFloats * sizeof(float));
  PageBuffer b;
  EXPECT_TRUE(b.empty());
  b.Allocate(kFloats);
  ASSERT_EQ(b.size(), kFloats);
  float sum = 0;
  for (size_t i = 0; i < kFloats; i += 1024) sum += b.data()[i];
  EXPECT_EQ(sum, 0.0f);
  const long before = ResidentBytes();
  for (size_t i = 0; i < kFloats; ++i) b.data()[i] = 1.0f;  // faulted in
  const long written = ResidentBytes();
  EXPECT_GE(written - before, kBytes * 9 / 10);

  PageBuffer moved = std::move(b);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(moved.size(), kFloats);
  EXPECT_EQ(moved.span()[kFloats - 1], 1.0f);
  PageBuffer other;
  other.Allocate(16);
  other.swap(moved);
  EXPECT_EQ(other.size(), kFloats);
  EXPECT_EQ(moved.size(), 16u);

  other.Release();
  EXPECT_TRUE(other.empty());
  EXPECT_LE(ResidentBytes(), written - kBytes * 9 / 10)
      << "the pages were not given back";
  other.Allocate(8);  // again after a release: fresh zeros
  EXPECT_EQ(other.span()[7], 0.0f);
}

}  // namespace
}  // namespace pserver
