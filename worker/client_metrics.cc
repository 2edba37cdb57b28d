#include "worker/client_metrics.h"

#include <utility>

namespace pserver {
namespace {

using prometheus::BuildCounter;

prometheus::Counter& Counter(prometheus::Registry& r, const char* name,
                             const char* help,
                             const std::map<std::string, std::string>& labels) {
  return BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

constexpr char kPayloadHelp[] = "Encoded payload bytes, by direction.";
constexpr char kFp32Help[] = "Bytes fp32 would have moved, by direction.";

}  // namespace

ClientMetrics::ClientMetrics(prometheus::Registry* registry)
    : ClientMetrics(registry == nullptr
                        ? std::make_unique<prometheus::Registry>()
                        : nullptr,
                    registry) {}

ClientMetrics::ClientMetrics(std::unique_ptr<prometheus::Registry> own,
                             prometheus::Registry* given)
    : own_registry_(std::move(own)),
      r_(given != nullptr ? *given : *own_registry_),
      encode_seconds_(Counter(r_,
                              "pserver_worker_encode_seconds_total",
                              "Time spent encoding pushes.", {})),
      push_bytes_(Counter(r_,
                          "pserver_worker_payload_bytes_total", kPayloadHelp,
                          {{"direction", "push"}})),
      pull_bytes_(Counter(r_,
                          "pserver_worker_payload_bytes_total", kPayloadHelp,
                          {{"direction", "pull"}})),
      push_fp32_bytes_(Counter(r_,
                               "pserver_worker_fp32_equivalent_bytes_total",
                               kFp32Help, {{"direction", "push"}})),
      pull_fp32_bytes_(Counter(r_,
                               "pserver_worker_fp32_equivalent_bytes_total",
                               kFp32Help, {{"direction", "pull"}})),
      retries_(Counter(r_,
                       "pserver_worker_rpc_retries_total",
                       "RPC attempts retried after UNAVAILABLE or a deadline.",
                       {})),
      snapshots_(Counter(r_,
                         "pserver_worker_snapshots_total",
                         "Pulls answered with a full snapshot.", {})),
      checksum_mismatches_(Counter(
          r_,
          "pserver_worker_checksum_mismatches_total",
          "Pulled replica slices that did not match the shard's checksum "
          "(each is re-pulled as a snapshot).",
          {})),
      rejoins_(Counter(r_,
                       "pserver_worker_rejoins_total",
                       "Re-registrations with a shard that restarted or "
                       "dropped this worker.",
                       {})) {}

void ClientMetrics::CountPush(uint64_t payload_bytes, uint64_t fp32_bytes) {
  stats_.push_payload_bytes += payload_bytes;
  stats_.push_fp32_bytes += fp32_bytes;
  push_bytes_.Increment(static_cast<double>(payload_bytes));
  push_fp32_bytes_.Increment(static_cast<double>(fp32_bytes));
}

void ClientMetrics::CountPull(uint64_t payload_bytes, uint64_t fp32_bytes) {
  stats_.pull_payload_bytes += payload_bytes;
  stats_.pull_fp32_bytes += fp32_bytes;
  pull_bytes_.Increment(static_cast<double>(payload_bytes));
  pull_fp32_bytes_.Increment(static_cast<double>(fp32_bytes));
}

void ClientMetrics::CountSnapshot() {
  ++stats_.snapshots;
  snapshots_.Increment();
}

void ClientMetrics::CountChecksumMismatch() {
  ++stats_.checksum_mismatches;
  checksum_mismatches_.Increment();
}

void ClientMetrics::CountRetries(uint64_t n) {
  stats_.retries += n;
  retries_.Increment(static_cast<double>(n));
}

void ClientMetrics::CountRejoin() {
  ++stats_.rejoins;
  rejoins_.Increment();
}

void ClientMetrics::AddEncodeSeconds(double s) {
  stats_.encode_seconds += s;
  encode_seconds_.Increment(s);
}

void ClientMetrics::SetLog(std::function<void(absl::string_view)> sink) {
  log_ = sink ? std::make_unique<RateLimitedLog>(Clock::Real(), 10,
                                                 absl::Seconds(10),
                                                 std::move(sink))
              : nullptr;
}

void ClientMetrics::Note(absl::string_view line) {
  if (log_ != nullptr) log_->Log(line);
}

}  // namespace pserver
