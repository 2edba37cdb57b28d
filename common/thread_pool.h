// One bounded pool of worker threads for the data-parallel parts of a shard
// (decoding two pushes at once, the optimizer's and the replica's chunked
// loops), so no call starts a thread of its own.
//
// Usage:
//   ThreadPool pool(1);  // one helper: the caller plus one thread = 2 cores
//   pool.ParallelFor(n, 1 << 16, [&](uint64_t b, uint64_t e) { ... });
//   pool.RunBoth([&] { DecodeA(); }, [&] { DecodeB(); });
#ifndef PSERVER_COMMON_THREAD_POOL_H_
#define PSERVER_COMMON_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace pserver {

// Thread-safe: any number of threads may submit work at once. Not
// reentrant: the functions given to ParallelFor and RunBoth must not call
// into the same pool (a helper blocked in a nested call waits for chunks
// that only the blocked helpers could run: a deadlock). With that, waiting
// callers cannot deadlock it.
class ThreadPool {
 public:
  // `helpers` threads besides the calling ones (0: everything runs on the
  // caller). REQUIRES: helpers >= 0.
  explicit ThreadPool(int helpers);
  // Finishes queued work, then joins the threads.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int helpers() const { return static_cast<int>(threads_.size()); }

  // Runs fn(begin, end) over [0, n) cut into at most helpers() + 1
  // contiguous chunks of at least `min_chunk` elements; the caller runs the
  // first chunk. Returns when every chunk is done. The chunking depends only
  // on n, min_chunk and helpers(), never on timing.
  void ParallelFor(uint64_t n, uint64_t min_chunk,
                   absl::FunctionRef<void(uint64_t, uint64_t)> fn);

  // Runs a on the caller and b on a helper (or after a, without helpers);
  // returns when both are done.
  void RunBoth(absl::FunctionRef<void()> a, absl::FunctionRef<void()> b);

  // A process-wide pool with one helper (two cores), for code without an
  // injected pool (tests, tools).
  static ThreadPool* Default();

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pserver

#endif  // PSERVER_COMMON_THREAD_POOL_H_
