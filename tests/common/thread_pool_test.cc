// ThreadPool (common/thread_pool.h): ParallelFor covers [0, n) exactly once
// in at most helpers() + 1 contiguous chunks that depend only on n,
// min_chunk and helpers(); the caller runs the first chunk; no call starts a
// thread; any number of threads may use one pool at once.
#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <dirent.h>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using Chunk = std::pair<uint64_t, uint64_t>;

// The chunks one ParallelFor call ran, sorted by start.
std::vector<Chunk> ChunksOf(ThreadPool& pool, uint64_t n, uint64_t min_chunk) {
  absl::Mutex mu;
  std::vector<Chunk> chunks;
  pool.ParallelFor(n, min_chunk, [&](uint64_t b, uint64_t e) {
    absl::MutexLock l(&mu);
    chunks.emplace_back(b, e);
  });
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

// Threads of this process now (entries of /proc/self/task).
int ThreadCount() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

TEST(ThreadPool, ParallelForCoversEveryIndexExactlyOnce) {
  for (int helpers : {0, 1, 3}) {
    ThreadPool pool(helpers);
    EXPECT_EQ(pool.helpers(), helpers);
    for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{7},
                       uint64_t{1000}, uint64_t{(1 << 16) + 3}}) {
      for (uint64_t min_chunk : {uint64_t{0}, uint64_t{1}, uint64_t{10},
                                 uint64_t{1} << 16}) {
        std::vector<std::atomic<int>> hits(n);
        for (auto& h : hits) h.store(0);
        pool.ParallelFor(n, min_chunk, [&](uint64_t b, uint64_t e) {
          for (uint64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of n=" << n
                                       << " min_chunk=" << min_chunk
                                       << " helpers=" << helpers;
        }
      }
    }
  }
}

TEST(ThreadPool, ChunksAreContiguousBoundedAndDeterministic) {
  ThreadPool pool(3);
  for (uint64_t n : {uint64_t{1}, uint64_t{5}, uint64_t{100}, uint64_t{1001},
                     uint64_t{100000}}) {
    for (uint64_t min_chunk : {uint64_t{1}, uint64_t{30}, uint64_t{400}}) {
      std::vector<Chunk> c = ChunksOf(pool, n, min_chunk);
      ASSERT_FALSE(c.empty());
      // At most helpers + 1 chunks, tiling [0, n) in order.
      EXPECT_LE(c.size(), 4u);
      EXPECT_EQ(c.front().first, 0u);
      EXPECT_EQ(c.back().second, n);
      for (size_t i = 0; i + 1 < c.size(); ++i) {
        EXPECT_EQ(c[i].second, c[i + 1].first);
      }
      // Split only when every chunk gets at least min_chunk elements.
      if (c.size() > 1) {
        for (const Chunk& k : c) EXPECT_GE(k.second - k.first, min_chunk);
      }
      // The same call gives the same chunks, whatever the timing.
      for (int rep = 0; rep < 20; ++rep) {
        ASSERT_EQ(ChunksOf(pool, n, min_chunk), c);
      }
    }
  }
  // Enough work: all four threads get a chunk; too little: one chunk.
  EXPECT_EQ(ChunksOf(pool, 4000, 1000).size(), 4u);
  EXPECT_EQ(ChunksOf(pool, 1999, 1000).size(), 1u);
  EXPECT_EQ(ChunksOf(pool, 2000, 1000).size(), 2u);
}

TEST(ThreadPool, CallerRunsTheFirstChunkAndHelpersTheRest) {
  ThreadPool pool(1);
  const std::thread::id me = std::this_thread::get_id();
  absl::Mutex mu;
  std::vector<std::pair<uint64_t, std::thread::id>> who;
  pool.ParallelFor(100, 10, [&](uint64_t b, uint64_t) {
    absl::MutexLock l(&mu);
    who.emplace_back(b, std::this_thread::get_id());
  });
  ASSERT_EQ(who.size(), 2u);
  std::sort(who.begin(), who.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  EXPECT_EQ(who[0].second, me);
  EXPECT_NE(who[1].second, me);
}

TEST(ThreadPool, NoHelpersRunsEverythingOnTheCaller) {
  ThreadPool pool(0);
  const std::thread::id me = std::this_thread::get_id();
  int calls = 0;
  pool.ParallelFor(1 << 20, 1, [&](uint64_t b, uint64_t e) {
    ++calls;
    EXPECT_EQ(b, 0u);
    EXPECT_EQ(e, uint64_t{1} << 20);
    EXPECT_EQ(std::this_thread::get_id(), me);
  });
  EXPECT_EQ(calls, 1);
  std::vector<int> order;
  pool.RunBoth([&] { order.push_back(1); }, [&] { order.push_back(2); });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));  // a, then b, both here
}

TEST(ThreadPool, RunBothRunsAOnTheCallerAndBOnAHelper) {
  ThreadPool pool(1);
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id a_on, b_on;
  std::atomic<int> done{0};
  pool.RunBoth(
      [&] {
        a_on = std::this_thread::get_id();
        done.fetch_add(1);
      },
      [&] {
        b_on = std::this_thread::get_id();
        done.fetch_add(1);
      });
  // Both finished before RunBoth returned.
  EXPECT_EQ(done.load(), 2);
  EXPECT_EQ(a_on, me);
  EXPECT_NE(b_on, me);
}

TEST(ThreadPool, ThreadsAreBoundedAndNoCallStartsOne) {
  const int before = ThreadCount();
  ASSERT_GT(before, 0);
  ThreadPool pool(2);
  EXPECT_EQ(ThreadCount(), before + 2);
  absl::Mutex mu;
  std::set<std::thread::id> ids;
  for (int i = 0; i < 500; ++i) {
    pool.ParallelFor(3000, 1, [&](uint64_t, uint64_t) {
      absl::MutexLock l(&mu);
      ids.insert(std::this_thread::get_id());
    });
    pool.RunBoth([] {}, [] {});
  }
  // The caller and the two helpers, never more.
  EXPECT_LE(ids.size(), 3u);
  EXPECT_EQ(ThreadCount(), before + 2);
}

TEST(ThreadPool, ConcurrentCallersEachGetTheirOwnCompleteResult) {
  ThreadPool pool(1);
  constexpr int kCallers = 4;
  constexpr uint64_t kN = 10000;
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 200; ++rep) {
        std::vector<uint64_t> out(kN, 0);
        pool.ParallelFor(kN, 100, [&](uint64_t b, uint64_t e) {
          for (uint64_t i = b; i < e; ++i) out[i] = i * (c + 1);
        });
        for (uint64_t i = 0; i < kN; ++i) {
          if (out[i] != i * (c + 1)) {
            wrong.fetch_add(1);
            break;
          }
        }
        int a = 0, b = 0;
        pool.RunBoth([&] { a = c + 1; }, [&] { b = c + 2; });
        if (a != c + 1 || b != c + 2) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadPool, DestructorFinishesQueuedWorkAndJoins) {
  // Work handed to the pool by a call is always finished before the call
  // returns; a pool destroyed right after busy use joins cleanly.
  std::atomic<uint64_t> sum{0};
  for (int rep = 0; rep < 50; ++rep) {
    ThreadPool pool(3);
    pool.ParallelFor(1000, 1, [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) sum.fetch_add(i);
    });
  }
  EXPECT_EQ(sum.load(), 50u * (999u * 1000u / 2));
}

TEST(ThreadPool, DefaultPoolHasOneHelperAndIsShared) {
  ThreadPool* p = ThreadPool::Default();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p, ThreadPool::Default());
  EXPECT_EQ(p->helpers(), 1);
}

}  // namespace
}  // namespace pserver
