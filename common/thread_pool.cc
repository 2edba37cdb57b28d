#include "common/thread_pool.h"

#include <algorithm>

#include "absl/synchronization/blocking_counter.h"

namespace pserver {

ThreadPool::ThreadPool(int helpers) {
  threads_.reserve(static_cast<size_t>(std::max(helpers, 0)));
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

ThreadPool* ThreadPool::Default() {
  static ThreadPool* pool = new ThreadPool(1);
  return pool;
}

void ThreadPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(uint64_t n, uint64_t min_chunk,
                             absl::FunctionRef<void(uint64_t, uint64_t)> fn) {
  const uint64_t max_chunks = static_cast<uint64_t>(helpers()) + 1;
  const uint64_t by_size = std::max<uint64_t>(1, n / std::max<uint64_t>(min_chunk, 1));
  const uint64_t chunks = std::min(max_chunks, by_size);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  const uint64_t per = n / chunks;
  absl::BlockingCounter left(static_cast<int>(chunks - 1));
  {
    absl::MutexLock l(&mu_);
    for (uint64_t c = 1; c < chunks; ++c) {
      const uint64_t b = c * per;
      const uint64_t e = c + 1 == chunks ? n : b + per;
      queue_.push_back([&fn, &left, b, e] {
        fn(b, e);
        left.DecrementCount();
      });
    }
  }
  fn(0, per);
  left.Wait();
}

void ThreadPool::RunBoth(absl::FunctionRef<void()> a,
                         absl::FunctionRef<void()> b) {
  if (helpers() == 0) {
    a();
    b();
    return;
  }
  absl::BlockingCounter left(1);
  {
    absl::MutexLock l(&mu_);
    queue_.push_back([&b, &left] {
      b();
      left.DecrementCount();
    });
  }
  a();
  left.Wait();
}

}  // namespace pserver
