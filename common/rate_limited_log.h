// Logging that a stream of bad requests cannot turn into a flood: at most
// `max_lines` lines per `interval`, the rest counted and reported as one
// "suppressed" line when the next interval's first line is written.
//
// Usage:
//   RateLimitedLog log(Clock::Real(), 10, absl::Seconds(10), WriteToStderr);
//   log.Log("worker 3 sent a tensor name that is not UTF-8");
#ifndef PSERVER_COMMON_RATE_LIMITED_LOG_H_
#define PSERVER_COMMON_RATE_LIMITED_LOG_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace pserver {

// Thread-safe. The sink is called without the internal lock held, so two
// threads' lines may reach it in either order.
class RateLimitedLog {
 public:
  using Sink = std::function<void(absl::string_view line)>;

  // REQUIRES: max_lines >= 1, interval > 0; `clock` outlives the log.
  RateLimitedLog(Clock* clock, int max_lines, absl::Duration interval,
                 Sink sink);

  // Writes `line` if fewer than max_lines were written in the current
  // interval, else counts it as suppressed. An interval starts with the
  // first line after the previous one ended; its first line is preceded by
  // "<K> similar lines suppressed in the last <interval>" if K > 0.
  void Log(absl::string_view line) ABSL_LOCKS_EXCLUDED(mu_);

  // Lines suppressed since construction.
  int64_t suppressed_total() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Clock* const clock_;
  const int max_lines_;
  const absl::Duration interval_;
  const Sink sink_;

  mutable absl::Mutex mu_;
  absl::Time interval_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int written_in_interval_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_in_interval_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_total_ ABSL_GUARDED_BY(mu_) = 0;
};

// Routes protobuf's log messages (e.g. "String field ... contains invalid
// UTF-8 data", written once per bad request by the parser) through a
// process-wide RateLimitedLog to stderr: 10 lines per 10 seconds. FATAL
// messages are never suppressed. protobuf's handler is one process-wide
// function pointer, hence the one process-wide log; installing it again is a
// no-op. Thread-safe.
void RateLimitProtobufLogs();

}  // namespace pserver

#endif  // PSERVER_COMMON_RATE_LIMITED_LOG_H_
