#include "worker/batcher.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

std::vector<uint32_t> ToVector(absl::Span<const uint32_t> s) {
  return std::vector<uint32_t>(s.begin(), s.end());
}

TEST(EpochPermutation, IsAPermutationDeterministicAndDiffersByEpoch) {
  const std::vector<uint32_t> p0 = EpochPermutation(1000, 17, 0);
  std::vector<uint32_t> sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(p0, EpochPermutation(1000, 17, 0));
  EXPECT_NE(p0, EpochPermutation(1000, 17, 1));
  EXPECT_NE(p0, EpochPermutation(1000, 18, 0));
  // Shuffled, not the identity or nearly so.
  int fixed = 0;
  for (uint32_t i = 0; i < 1000; ++i) fixed += p0[i] == i;
  EXPECT_LT(fixed, 10);
  EXPECT_TRUE(EpochPermutation(0, 1, 0).empty());
  EXPECT_EQ(EpochPermutation(1, 1, 0), std::vector<uint32_t>{0});
}

TEST(EpochPermutation, IsRoughlyUniform) {
  // Position of element 0 over many epochs of a 4-element shuffle.
  int counts[4] = {};
  for (int epoch = 0; epoch < 4000; ++epoch) {
    const std::vector<uint32_t> p = EpochPermutation(4, 5, epoch);
    ++counts[std::find(p.begin(), p.end(), 0u) - p.begin()];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(Batcher, CreateRejectsBadArguments) {
  EXPECT_FALSE(Batcher::Create(100, 0, 0, 8, 1).ok());
  EXPECT_FALSE(Batcher::Create(100, 2, 2, 8, 1).ok());
  EXPECT_FALSE(Batcher::Create(100, 2, -1, 8, 1).ok());
  EXPECT_FALSE(Batcher::Create(100, 2, 0, 0, 1).ok());
  EXPECT_EQ(Batcher::Create(100, 4, 0, 32, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Batcher::Create(128, 4, 3, 32, 1).ok());
}

TEST(Batcher, StepsPerEpochDropTheRemainder) {
  absl::StatusOr<Batcher> b = Batcher::Create(60000, 4, 0, 32, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->steps_per_epoch(), 468);  // 60000 / 128 = 468.75
  EXPECT_EQ(b->global_batch_size(), 128);
}

TEST(Batcher, WorkerSlicesPartitionTheGlobalBatch) {
  const int workers = 4, batch = 8;
  const int64_t n = 1000;
  std::vector<Batcher> batchers;
  for (int w = 0; w < workers; ++w) {
    absl::StatusOr<Batcher> b = Batcher::Create(n, workers, w, batch, 99);
    ASSERT_TRUE(b.ok());
    batchers.push_back(*b);
  }
  // One process with batch W*b and the same seed sees the same examples.
  absl::StatusOr<Batcher> single = Batcher::Create(n, 1, 0, workers * batch, 99);
  ASSERT_TRUE(single.ok());
  ASSERT_EQ(single->steps_per_epoch(), batchers[0].steps_per_epoch());
  const int64_t steps = batchers[0].steps_per_epoch();  // 31
  for (int64_t step = 0; step < 2 * steps + 3; ++step) {
    std::vector<uint32_t> joined;
    for (int w = 0; w < workers; ++w) {
      const std::vector<uint32_t> slice = ToVector(batchers[w].WorkerBatch(step));
      ASSERT_EQ(slice.size(), static_cast<size_t>(batch));
      joined.insert(joined.end(), slice.begin(), slice.end());
    }
    EXPECT_EQ(joined, ToVector(batchers[0].GlobalBatch(step)));
    EXPECT_EQ(joined, ToVector(single->WorkerBatch(step)));
    EXPECT_EQ(std::set<uint32_t>(joined.begin(), joined.end()).size(),
              joined.size());
  }
}

TEST(Batcher, FollowsTheEpochPermutation) {
  const int workers = 3, batch = 5;
  const int64_t n = 100;  // 6 steps of 15, 10 examples dropped per epoch
  absl::StatusOr<Batcher> b = Batcher::Create(n, workers, 2, batch, 7);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->steps_per_epoch(), 6);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<uint32_t> perm = EpochPermutation(n, 7, epoch);
    std::set<uint32_t> seen;
    for (int64_t g = 0; g < 6; ++g) {
      const std::vector<uint32_t> slice = ToVector(b->WorkerBatch(epoch * 6 + g));
      const std::vector<uint32_t> expected(
          perm.begin() + g * 15 + 2 * batch, perm.begin() + g * 15 + 3 * batch);
      EXPECT_EQ(slice, expected) << "epoch " << epoch << " step " << g;
      seen.insert(slice.begin(), slice.end());
    }
    EXPECT_EQ(seen.size(), 30u);  // no example twice within an epoch
  }
  // Going back to an earlier epoch recomputes the same permutation.
  const std::vector<uint32_t> later = ToVector(b->WorkerBatch(13));
  b->WorkerBatch(0);
  EXPECT_EQ(ToVector(b->WorkerBatch(13)), later);
  EXPECT_NE(ToVector(b->WorkerBatch(1)), ToVector(b->WorkerBatch(7)));
}

TEST(Batcher, GatherCopiesRowsAndLabels) {
  Dataset d;
  d.size = 4;
  d.rows = 1;
  d.cols = 3;
  d.num_classes = 10;
  d.images = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32};
  d.labels = {5, 6, 7, 8};
  const std::vector<uint32_t> idx = {3, 1};
  std::vector<float> x(6);
  std::vector<uint8_t> y(2);
  GatherBatch(d, idx, x.data(), y.data());
  EXPECT_EQ(x, (std::vector<float>{30, 31, 32, 10, 11, 12}));
  EXPECT_EQ(y, (std::vector<uint8_t>{8, 6}));
}

}  // namespace
}  // namespace pserver
