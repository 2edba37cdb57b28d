// Prometheus metrics of one shard daemon. Families are built once on the
// injected registry; label children are cached. Every series carries the
// `shard` label. Names follow the Prometheus guide: pserver_ prefix, base
// units, counters end in _total.
#ifndef PSERVER_SERVER_METRICS_H_
#define PSERVER_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pserver {

// Thread-safe.
class ServerMetrics {
 public:
  ServerMetrics(prometheus::Registry& registry, uint32_t shard_index);

  // One finished RPC; `code` is the gRPC code name, e.g. "OK".
  void CountRequest(const std::string& method, const std::string& code);
  // A rejected request, by reason (a short snake_case word).
  void CountRejected(const std::string& reason);
  // Payload bytes of encoded tensors and the fp32 bytes they stand for.
  void AddReceived(const std::string& codec, uint64_t bytes, uint64_t fp32_bytes);
  void AddSent(const std::string& codec, uint64_t bytes, uint64_t fp32_bytes);
  void AddDecodedElements(uint64_t n);
  void ObserveRound(double seconds);
  void ObserveAggregation(double seconds);
  void ObserveOptimizer(double seconds);
  void ObservePullEncode(double seconds);
  void SetStep(uint64_t step);
  void SetStage(int stage);  // 1 warmup, 2 compression
  void SetWorkersRegistered(uint32_t n);
  void SetNorms(double update, double momentum, double replica_residual);
  void SetModelElements(uint64_t n);
  void AddSkippedRounds(uint64_t n);
  void SetWorkersLive(uint32_t n);
  void AddDroppedWorker();
  // A checkpoint written (ok) or failed, and how long the write took.
  void ObserveCheckpoint(bool ok, double seconds);

 private:
  prometheus::Counter& Child(prometheus::Family<prometheus::Counter>& f,
                             const std::map<std::string, std::string>& labels);

  const std::string shard_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& bytes_received_;
  prometheus::Family<prometheus::Counter>& bytes_sent_;
  prometheus::Family<prometheus::Gauge>& compression_ratio_;
  prometheus::Counter& decoded_elements_;
  prometheus::Histogram& round_seconds_;
  prometheus::Histogram& aggregation_seconds_;
  prometheus::Histogram& optimizer_seconds_;
  prometheus::Histogram& pull_encode_seconds_;
  prometheus::Gauge& step_;
  prometheus::Gauge& stage_;
  prometheus::Gauge& workers_registered_;
  prometheus::Gauge& update_norm_;
  prometheus::Gauge& momentum_norm_;
  prometheus::Gauge& residual_norm_;
  prometheus::Gauge& model_elements_;
  prometheus::Counter& skipped_rounds_;
  prometheus::Gauge& workers_live_;
  prometheus::Counter& workers_dropped_;
  prometheus::Histogram& checkpoint_seconds_;
  prometheus::Counter& checkpoint_failures_;
  prometheus::Gauge& checkpoint_timestamp_;

  absl::Mutex mu_;
  // Totals behind the compression-ratio gauges.
  uint64_t received_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t received_fp32_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_fp32_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_METRICS_H_
