#include "common/rate_limited_log.h"

#include <cstdio>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"

namespace pserver {

RateLimitedLog::RateLimitedLog(Clock* clock, int max_lines,
                               absl::Duration interval, Sink sink)
    : clock_(clock),
      max_lines_(max_lines),
      interval_(interval),
      sink_(std::move(sink)) {}

void RateLimitedLog::Log(absl::string_view line) {
  int64_t report_suppressed = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    if (now - interval_start_ >= interval_) {
      report_suppressed = suppressed_in_interval_;
      interval_start_ = now;
      written_in_interval_ = 0;
      suppressed_in_interval_ = 0;
    }
    if (written_in_interval_ >= max_lines_) {
      ++suppressed_in_interval_;
      ++suppressed_total_;
      return;
    }
    ++written_in_interval_;
  }
  if (report_suppressed > 0) {
    sink_(absl::StrCat(report_suppressed,
                       " similar lines suppressed in the last ",
                       absl::FormatDuration(interval_), " (at most ",
                       max_lines_, " per interval)"));
  }
  sink_(line);
}

int64_t RateLimitedLog::suppressed_total() const {
  absl::MutexLock lock(&mu_);
  return suppressed_total_;
}

namespace {

void WriteToStderr(absl::string_view line) {
  std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
}

RateLimitedLog& ProtobufLog() {
  // Process lifetime: protobuf may log from any thread until exit.
  static RateLimitedLog* log =
      new RateLimitedLog(Clock::Real(), 10, absl::Seconds(10), WriteToStderr);
  return *log;
}

const char* LevelName(google::protobuf::LogLevel level) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO: return "INFO";
    case google::protobuf::LOGLEVEL_WARNING: return "WARNING";
    case google::protobuf::LOGLEVEL_ERROR: return "ERROR";
    case google::protobuf::LOGLEVEL_FATAL: return "FATAL";
  }
  return "?";
}

void ProtobufLogHandler(google::protobuf::LogLevel level, const char* filename,
                        int line, const std::string& message) {
  // The format of protobuf's default handler.
  std::string text = absl::StrCat("[libprotobuf ", LevelName(level), " ",
                                   filename, ":", line, "] ", message);
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    WriteToStderr(text);
    return;
  }
  ProtobufLog().Log(text);
}

}  // namespace

void RateLimitProtobufLogs() {
  static std::once_flag once;
  std::call_once(once, [] {
    ProtobufLog();
    google::protobuf::SetLogHandler(&ProtobufLogHandler);
  });
}

}  // namespace pserver
