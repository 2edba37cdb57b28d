// Round (server/round.h): validated pushes are summed in worker-id order
// whatever order they arrive in, workers the round does not wait for are
// passed over, every push summed is one contributor and the mean divides by
// exactly that count; two large consecutive pushes are decoded at once with
// the same bits as one at a time.
#include "server/round.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "common/codec.h"
#include "common/thread_pool.h"
#include "common/validated_tensor.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/test_helpers.h"

namespace pserver {
namespace {

using testing_util::Fp32Tensor;
using testing_util::Gradient;

Round::Push PushOf(const v1::EncodedTensor& t) {
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, t.num_elements());
  EXPECT_TRUE(v.ok()) << v.status();
  return Round::Push::CopyOf(*v);  // the round keeps its own copy
}
Round::Push PushOf(const std::vector<float>& g) { return PushOf(Fp32Tensor(g)); }

bool WaitAll(uint32_t) { return true; }

// Sums everything BeginSum hands out; returns the batches' sizes.
std::vector<uint32_t> DrainAll(Round& r,
                               absl::FunctionRef<bool(uint32_t)> waits_for) {
  std::vector<uint32_t> sizes;
  while (std::optional<Round::Batch> b = r.BeginSum(waits_for)) {
    EXPECT_TRUE(r.summing());
    r.sum()->Add(*b);
    r.EndSum(*b);
    EXPECT_FALSE(r.summing());
    sizes.push_back(b->chunk);
  }
  return sizes;
}

std::vector<float> MeanOf(Round& r) {
  std::vector<float> out;
  r.WithMean([&](absl::Span<float> mean) { out.assign(mean.begin(), mean.end()); });
  return out;
}

using testing_util::BitEqual;

TEST(Round, SumsInWorkerIdOrderWhateverTheArrivalOrder) {
  // Values whose float sum depends on the order of additions.
  const std::vector<std::vector<float>> g = {
      {1e8f, 1.0f, 3.0f}, {1.0f, 1e8f, -3.0f}, {-1e8f, -1e8f, 1e-7f}};
  std::vector<float> want(3, 0.0f);
  for (const auto& v : g) {
    for (int i = 0; i < 3; ++i) want[i] += v[i];
  }
  ThreadPool pool(1);
  for (const std::vector<uint32_t>& order :
       {std::vector<uint32_t>{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}}) {
    Round r(3, &pool);
    r.Resize(3);
    for (uint32_t w : order) {
      EXPECT_FALSE(r.pushed(w));
      r.Queue(w, PushOf(g[w]));
      EXPECT_TRUE(r.queued(w));
      EXPECT_TRUE(r.started());
      DrainAll(r, WaitAll);
    }
    EXPECT_EQ(r.received(), 3u);
    ASSERT_TRUE(r.all_in());
    EXPECT_EQ(r.contributors(), 3u);
    std::vector<float> mean = MeanOf(r);
    std::vector<float> want_mean = want;
    for (float& f : want_mean) f *= 1.0f / 3.0f;
    EXPECT_TRUE(BitEqual(mean, want_mean)) << "arrival order " << order[0]
                                           << order[1] << order[2];
  }
}

TEST(Round, WaitsForTheNextAwaitedWorkerBeforeSummingLaterOnes) {
  ThreadPool pool(0);
  Round r(3, &pool);
  r.Resize(4);
  r.Queue(2, PushOf(std::vector<float>(4, 2.0f)));
  r.Queue(1, PushOf(std::vector<float>(4, 1.0f)));
  // Worker 0 is awaited and missing: nothing can be summed yet.
  EXPECT_FALSE(r.BeginSum(WaitAll).has_value());
  EXPECT_FALSE(r.summed(1));
  EXPECT_FALSE(r.all_in());
  EXPECT_EQ(r.contributors(), 0u);
  r.Queue(0, PushOf(std::vector<float>(4, 6.0f)));
  EXPECT_EQ(DrainAll(r, WaitAll).size(), 3u);  // small: one at a time
  EXPECT_TRUE(r.summed(0) && r.summed(1) && r.summed(2));
  EXPECT_TRUE(r.pushed(2));
  EXPECT_EQ(MeanOf(r), std::vector<float>(4, 3.0f));
}

TEST(Round, PassedOverWorkersAreNotContributors) {
  ThreadPool pool(0);
  Round r(4, &pool);
  r.Resize(2);
  // Workers 1 and 3 are not waited for (dropped); 0 and 2 push.
  auto waits = [](uint32_t w) { return w % 2 == 0; };
  r.Queue(2, PushOf(std::vector<float>{4.0f, 8.0f}));
  EXPECT_FALSE(r.BeginSum(waits).has_value());  // 0 is awaited
  r.Queue(0, PushOf(std::vector<float>{2.0f, 2.0f}));
  std::optional<Round::Batch> b = r.BeginSum(waits);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->first, 0u);
  EXPECT_EQ(b->skipped, 0u);
  // A second thread gets nothing while the first holds a batch.
  EXPECT_FALSE(r.BeginSum(waits).has_value());
  r.sum()->Add(*b);
  r.EndSum(*b);
  b = r.BeginSum(waits);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->first, 2u);
  EXPECT_EQ(b->skipped, 1u);  // worker 1 passed over
  r.sum()->Add(*b);
  r.EndSum(*b);
  // Worker 3 is passed over at the end; the round is complete.
  EXPECT_FALSE(r.BeginSum(waits).has_value());
  EXPECT_TRUE(r.all_in());
  EXPECT_EQ(r.contributors(), 2u);
  EXPECT_EQ(r.received(), 2u);
  EXPECT_EQ(MeanOf(r), (std::vector<float>{3.0f, 5.0f}));  // / 2, not / 4
}

TEST(Round, EveryWorkerPassedOverLeavesNoContributorsAndRestartWaitsAgain) {
  ThreadPool pool(0);
  Round r(2, &pool);
  r.Resize(1);
  EXPECT_FALSE(r.started());
  auto none = [](uint32_t) { return false; };
  EXPECT_FALSE(r.BeginSum(none).has_value());
  EXPECT_TRUE(r.all_in());
  EXPECT_TRUE(r.started());  // workers were passed over
  EXPECT_EQ(r.contributors(), 0u);
  r.Restart();
  EXPECT_FALSE(r.all_in());
  r.Queue(1, PushOf(std::vector<float>{5.0f}));
  EXPECT_FALSE(r.BeginSum(WaitAll).has_value());  // waits for worker 0 again
  auto only1 = [](uint32_t w) { return w == 1; };
  EXPECT_EQ(DrainAll(r, only1).size(), 1u);
  EXPECT_EQ(r.contributors(), 1u);
  EXPECT_EQ(MeanOf(r), std::vector<float>{5.0f});
}

TEST(Round, ClearStartsAFreshRoundWithAZeroSum) {
  ThreadPool pool(0);
  Round r(2, &pool);
  r.Resize(3);
  r.Queue(0, PushOf(std::vector<float>(3, 1.0f)));
  r.Queue(1, PushOf(std::vector<float>(3, 3.0f)));
  DrainAll(r, WaitAll);
  EXPECT_EQ(MeanOf(r), std::vector<float>(3, 2.0f));
  r.Clear();
  EXPECT_FALSE(r.started());
  EXPECT_EQ(r.received(), 0u);
  EXPECT_EQ(r.contributors(), 0u);
  EXPECT_FALSE(r.pushed(0) || r.pushed(1));
  r.Queue(0, PushOf(std::vector<float>(3, 10.0f)));
  r.Queue(1, PushOf(std::vector<float>(3, 20.0f)));
  DrainAll(r, WaitAll);
  // Nothing of the previous round (sum nor mean scaling) leaks in.
  EXPECT_EQ(MeanOf(r), std::vector<float>(3, 15.0f));
}

TEST(Round, QueuedPushIsTheRoundsOwnCopy) {
  ThreadPool pool(0);
  Round r(1, &pool);
  r.Resize(2);
  {
    v1::EncodedTensor t = Fp32Tensor(std::vector<float>{1.0f, 2.0f});
    r.Queue(0, PushOf(t));
    // The caller's tensor is changed (a reused request buffer).
    float junk[2] = {99.0f, 99.0f};
    std::memcpy(t.mutable_payload()->data(), junk, sizeof(junk));
  }
  DrainAll(r, WaitAll);
  EXPECT_EQ(MeanOf(r), (std::vector<float>{1.0f, 2.0f}));
}

TEST(Round, ChunksAreSummedIndependentlyEachInWorkerOrder) {
  // 3 chunks of 4 elements (the last one 2). Worker 1's chunk 2 can be
  // summed as soon as worker 0's chunk 2 is in, whatever the other chunks.
  const uint64_t n = 10;
  ThreadPool pool(1);
  Round r(2, &pool);
  r.Resize(n, 4);
  ASSERT_EQ(r.num_chunks(), 3u);
  auto piece = [&](uint32_t w, uint32_t c) {
    std::vector<float> g(r.plan().size(c));
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = (w == 0 ? 1e8f : 1.0f) * static_cast<float>(c + 1) +
             static_cast<float>(i);
    }
    return PushOf(g);
  };
  r.Queue(1, piece(1, 2), 2);
  EXPECT_TRUE(DrainAll(r, WaitAll).empty());  // waits for worker 0's chunk 2
  EXPECT_TRUE(r.queued(1, 2));
  EXPECT_FALSE(r.queued(1, 0));
  EXPECT_TRUE(r.queued_any(1));
  r.Queue(0, piece(0, 2), 2);
  EXPECT_EQ(DrainAll(r, WaitAll), (std::vector<uint32_t>{2, 2}));
  EXPECT_TRUE(r.summed(1, 2));
  EXPECT_FALSE(r.all_in());
  EXPECT_EQ(r.workers_in(), 2u);
  for (uint32_t c : {1u, 0u}) {
    r.Queue(1, piece(1, c), c);
    r.Queue(0, piece(0, c), c);
  }
  DrainAll(r, WaitAll);
  ASSERT_TRUE(r.all_in());
  EXPECT_EQ(r.contributors(), 2u);
  EXPECT_EQ(r.received(), 6u);
  // Want: per element (w0 + w1) / 2, added in worker order.
  std::vector<float> want(n);
  for (uint32_t c = 0; c < 3; ++c) {
    for (uint64_t i = 0; i < r.plan().size(c); ++i) {
      float acc = 0.0f;
      acc += 1e8f * static_cast<float>(c + 1) + static_cast<float>(i);
      acc += 1.0f * static_cast<float>(c + 1) + static_cast<float>(i);
      want[r.plan().begin(c) + i] = acc * 0.5f;
    }
  }
  EXPECT_TRUE(BitEqual(MeanOf(r), want));
}

TEST(Round, AChunkNoWorkerSentIsZeroAndOthersDivideByTheirOwnCount) {
  // Worker 1 is dropped (not waited for) after sending chunk 0 only: chunk 0
  // is the mean of two pushes, chunk 1 is worker 0's alone.
  ThreadPool pool(1);
  Round r(2, &pool);
  r.Resize(4, 2);
  r.Queue(0, PushOf(std::vector<float>{2.0f, 2.0f}), 0);
  r.Queue(0, PushOf(std::vector<float>{6.0f, 6.0f}), 1);
  r.Queue(1, PushOf(std::vector<float>{4.0f, 4.0f}), 0);
  DrainAll(r, [](uint32_t w) { return w == 0; });
  ASSERT_TRUE(r.all_in());
  EXPECT_EQ(MeanOf(r), (std::vector<float>{3.0f, 3.0f, 6.0f, 6.0f}));
}

TEST(Round, ClearHandsBackTheAcknowledgementsOfQueuedPushes) {
  ThreadPool pool(1);
  Round r(2, &pool);
  r.Resize(4, 2);
  int acked = 0;
  v1::EncodedTensor t = Fp32Tensor(std::vector<float>{1.0f, 2.0f});
  auto req = std::make_shared<v1::PushRequest>();
  *req->mutable_gradient() = t;
  auto v = ValidateTensor(req->gradient(), 2);
  ASSERT_TRUE(v.ok());
  r.Queue(1, Round::Push::Own(req, *v, [&acked] { ++acked; }), 1);
  EXPECT_TRUE(DrainAll(r, WaitAll).empty());
  std::vector<std::function<void()>> dropped = r.Clear();
  ASSERT_EQ(dropped.size(), 1u);
  dropped[0]();
  EXPECT_EQ(acked, 1);
  EXPECT_FALSE(r.queued_any(1));
}

TEST(Round, MeanMayBeOverwrittenAsScratchUntilClear) {
  ThreadPool pool(0);
  Round r(1, &pool);
  r.Resize(2);
  r.Queue(0, PushOf(std::vector<float>{4.0f, 6.0f}));
  DrainAll(r, WaitAll);
  r.WithMean([](absl::Span<float> mean) {
    EXPECT_EQ(mean[0], 4.0f);
    mean[0] = -1.0f;  // the shard reuses it for x - x_hat
  });
  r.Clear();
  r.Queue(0, PushOf(std::vector<float>{1.0f, 1.0f}));
  DrainAll(r, WaitAll);
  EXPECT_EQ(MeanOf(r), (std::vector<float>{1.0f, 1.0f}));
}

// The sum is not zeroed between rounds: each chunk's first push writes over
// what the last round left (scratch, NaN here), and a chunk no push wrote
// is zero, in the mean and in a kept (broadcast) range.
TEST(Round, NextRoundWritesOverTheScratchAndAnUnsentChunkIsZero) {
  ThreadPool pool(1);
  Round r(2, &pool);
  r.Resize(6, 2);
  for (uint32_t c = 0; c < 3; ++c) {
    r.Queue(0, PushOf(std::vector<float>{1.0f, 2.0f}), c);
    r.Queue(1, PushOf(std::vector<float>{3.0f, 4.0f}), c);
  }
  DrainAll(r, WaitAll);
  r.WithMean([](absl::Span<float> mean) {
    EXPECT_EQ(mean[5], 3.0f);
    std::fill(mean.begin(), mean.end(),
              std::numeric_limits<float>::quiet_NaN());
  });
  r.Clear();
  // Chunk 0 from both, chunk 1 from worker 0 only, chunk 2 from nobody.
  r.Queue(0, PushOf(std::vector<float>{-0.0f, 8.0f}), 0);
  r.Queue(1, PushOf(std::vector<float>{-0.0f, 2.0f}), 0);
  r.Queue(0, PushOf(std::vector<float>{7.0f, -0.0f}), 1);
  DrainAll(r, [](uint32_t) { return false; });  // waits for nobody now
  ASSERT_TRUE(r.all_in());
  const std::vector<std::pair<uint64_t, uint64_t>> keep = {{4, 6}};
  std::vector<float> got;
  r.WithMean([&got](absl::Span<float> mean) {
    got.assign(mean.begin(), mean.end());
  }, keep);
  // As sums from zero: 0 + -0 is +0.
  EXPECT_TRUE(BitEqual(got, std::vector<float>{0.0f, 5.0f, 7.0f, 0.0f,
                                               0.0f, 0.0f}));
}

}  // namespace
}  // namespace pserver
