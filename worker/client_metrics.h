// What the client counts (bytes, snapshots, retries, rejoins, time), in one
// place: each event is counted once, where it happens, into both the plain
// ClientStats the training loop reads and the Prometheus counters a worker
// daemon exports. Without a registry the counters live on a private registry
// that nobody scrapes (the no-op sink), so callers never test for one.
#ifndef PSERVER_WORKER_CLIENT_METRICS_H_
#define PSERVER_WORKER_CLIENT_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/strings/string_view.h"
#include "common/rate_limited_log.h"

#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace pserver {

// Bytes moved and time spent, since Client::Connect().
struct ClientStats {
  uint64_t steps = 0;
  uint64_t push_payload_bytes = 0;  // encoded tensor payloads sent
  uint64_t pull_payload_bytes = 0;  // encoded tensor payloads received
  uint64_t push_fp32_bytes = 0;     // what fp32 would have sent
  uint64_t pull_fp32_bytes = 0;
  uint64_t snapshots = 0;           // pulls answered with a full snapshot
  // The frozen variance fetched (fp32) when 1-bit Adam enters compression:
  // downlink bytes that are neither pushes nor pulls.
  uint64_t variance_payload_bytes = 0;
  uint64_t checksum_mismatches = 0;
  uint64_t retries = 0;
  uint64_t rejoins = 0;  // re-registrations after a shard restart or a drop
  double encode_seconds = 0;
  double push_seconds = 0;   // waiting on pushes (includes server rounds)
  double pull_seconds = 0;
};

// Thread-compatible: the one thread driving a Client counts; Prometheus
// scrapes read the counters' atomics from any thread.
class ClientMetrics {
 public:
  // Counters on `registry` (families built once). nullptr: a private
  // registry that is never exported.
  explicit ClientMetrics(prometheus::Registry* registry);

  const ClientStats& stats() const { return stats_; }

  void CountStep() { ++stats_.steps; }
  void CountPush(uint64_t payload_bytes, uint64_t fp32_bytes);
  void CountPull(uint64_t payload_bytes, uint64_t fp32_bytes);
  void CountSnapshot();
  void CountVariance(uint64_t payload_bytes) {
    stats_.variance_payload_bytes += payload_bytes;
  }
  void CountChecksumMismatch();
  void CountRetries(uint64_t n);
  void CountRejoin();
  void AddEncodeSeconds(double s);
  void AddPushSeconds(double s) { stats_.push_seconds += s; }
  void AddPullSeconds(double s) { stats_.pull_seconds += s; }

  // Lines for the operator (ClientOptions::log), rate-limited; none without
  // a sink.
  void SetLog(std::function<void(absl::string_view)> sink);
  void Note(absl::string_view line);

 private:
  ClientMetrics(std::unique_ptr<prometheus::Registry> own,
                prometheus::Registry* given);

  std::unique_ptr<prometheus::Registry> own_registry_;  // when none is given
  prometheus::Registry& r_;
  ClientStats stats_;
  prometheus::Counter& encode_seconds_;
  prometheus::Counter& push_bytes_;
  prometheus::Counter& pull_bytes_;
  prometheus::Counter& push_fp32_bytes_;
  prometheus::Counter& pull_fp32_bytes_;
  prometheus::Counter& retries_;
  prometheus::Counter& snapshots_;
  prometheus::Counter& checksum_mismatches_;
  prometheus::Counter& rejoins_;
  std::unique_ptr<RateLimitedLog> log_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_CLIENT_METRICS_H_
