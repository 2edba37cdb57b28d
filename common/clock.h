// Time as an injected dependency: components that expire or time things
// (leases, round durations) read a Clock, so tests drive time by hand
// instead of sleeping on the real one.
#ifndef PSERVER_COMMON_CLOCK_H_
#define PSERVER_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pserver {

// Thread-safe: Now() may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process's real clock (absl::Now); never destroyed.
  static Clock* Real();
};

// A clock that moves only when told to, for tests. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1))
      : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_COMMON_CLOCK_H_
