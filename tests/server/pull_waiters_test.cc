// PullWaiters (server/pull_waiters.h): parked pulls are handed back exactly
// once, by step (oldest first), by id, or all at shutdown; ids are never 0
// and never reused.
#include "server/pull_waiters.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::PullRequestFor;

// A PullDone that records into *calls which waiter it was.
PullDone Tag(std::vector<int>* calls, int tag) {
  return [calls, tag](absl::Status, PullAnswer) { calls->push_back(tag); };
}

TEST(PullWaiters, IdsAreNonZeroAndUnique) {
  PullWaiters w;
  std::set<uint64_t> ids;
  for (int i = 0; i < 100; ++i) {
    uint64_t id = w.Add(PullRequestFor(i % 3, 1, 0, 0), PullDone());
    EXPECT_NE(id, 0u);
    EXPECT_TRUE(ids.insert(id).second) << "id " << id << " reused";
  }
  EXPECT_EQ(w.size(), 100u);
  // Removing does not make an id available again.
  w.Remove(*ids.begin());
  uint64_t next = w.Add(PullRequestFor(0, 1, 0, 0), PullDone());
  EXPECT_EQ(ids.count(next), 0u);
}

TEST(PullWaiters, TakeReadyReturnsStepsUpToTheGivenOneOldestFirst) {
  PullWaiters w;
  std::vector<int> calls;
  w.Add(PullRequestFor(0, 3, 2, 0), Tag(&calls, 30));
  w.Add(PullRequestFor(1, 2, 1, 0), Tag(&calls, 20));
  w.Add(PullRequestFor(2, 4, 3, 0), Tag(&calls, 40));
  w.Add(PullRequestFor(3, 2, 1, 0), Tag(&calls, 21));
  EXPECT_TRUE(w.TakeReady(1).empty());
  std::vector<PullWaiters::Waiter> ready = w.TakeReady(3);
  ASSERT_EQ(ready.size(), 3u);
  // In the order they were parked, each with its request.
  EXPECT_EQ(ready[0].request.worker_id(), 0u);
  EXPECT_EQ(ready[1].request.worker_id(), 1u);
  EXPECT_EQ(ready[2].request.worker_id(), 3u);
  for (auto& r : ready) r.done(absl::OkStatus(), nullptr);
  EXPECT_EQ(calls, (std::vector<int>{30, 20, 21}));
  EXPECT_EQ(w.size(), 1u);
  // Taken waiters are gone: the same step gives nothing twice.
  EXPECT_TRUE(w.TakeReady(3).empty());
  EXPECT_EQ(w.TakeReady(4).size(), 1u);
  EXPECT_EQ(w.size(), 0u);
}

TEST(PullWaiters, RemoveHandsBackTheCallbackOnce) {
  PullWaiters w;
  std::vector<int> calls;
  uint64_t a = w.Add(PullRequestFor(0, 1, 0, 0), Tag(&calls, 1));
  uint64_t b = w.Add(PullRequestFor(1, 1, 0, 0), Tag(&calls, 2));
  PullDone done = w.Remove(b);
  ASSERT_TRUE(done);
  done(absl::CancelledError("deadline"), nullptr);
  EXPECT_EQ(calls, std::vector<int>{2});
  // Already removed, or already answered by the round: nothing.
  EXPECT_FALSE(w.Remove(b));
  std::vector<PullWaiters::Waiter> ready = w.TakeReady(1);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].id, a);
  EXPECT_FALSE(w.Remove(a));
  EXPECT_FALSE(w.Remove(12345));
}

TEST(PullWaiters, TakeAllEmptiesTheList) {
  PullWaiters w;
  std::vector<int> calls;
  for (int i = 0; i < 5; ++i) w.Add(PullRequestFor(i, i + 1, i, 0), Tag(&calls, i));
  std::vector<PullWaiters::Waiter> all = w.TakeAll();
  ASSERT_EQ(all.size(), 5u);
  for (auto& x : all) x.done(absl::UnavailableError("shutdown"), nullptr);
  EXPECT_EQ(calls, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(w.size(), 0u);
  EXPECT_TRUE(w.TakeAll().empty());
  EXPECT_TRUE(w.TakeReady(100).empty());
}

TEST(PullWaiters, IsWaitingFollowsTheParkedPulls) {
  PullWaiters w;
  EXPECT_FALSE(w.IsWaiting(2));
  uint64_t id = w.Add(PullRequestFor(2, 5, 4, 0), PullDone());
  w.Add(PullRequestFor(7, 6, 5, 0), PullDone());
  EXPECT_TRUE(w.IsWaiting(2));
  EXPECT_TRUE(w.IsWaiting(7));
  EXPECT_FALSE(w.IsWaiting(3));
  w.Remove(id);
  EXPECT_FALSE(w.IsWaiting(2));
  w.TakeReady(6);
  EXPECT_FALSE(w.IsWaiting(7));
}

}  // namespace
}  // namespace pserver
