// Prometheus metrics of one shard daemon. Families are built once on the
// injected registry; label children are built once and cached in arrays
// indexed by method, code, codec and reason, so an update is an atomic
// load plus the increment (no map, no lock). Every series carries the
// `shard` label. Names follow the Prometheus guide: pserver_ prefix, base
// units, counters end in _total.
//
// Code that reports metrics always has a ServerMetrics: without an exporter
// it gets Unexported(), a sink on a private registry nobody scrapes.
#ifndef PSERVER_SERVER_METRICS_H_
#define PSERVER_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "pserver/v1/codec.pb.h"
#include "pserver/v1/parameter_server.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pserver {

// The RPC methods, for the `method` label.
enum class RpcMethod {
  kRegister,
  kPush,
  kPull,
  kGetFrozenVariance,
  kGetStatus,
  kGetShardState,
  kInstallShardState,
  kLeave,
};
inline constexpr int kRpcMethods = 8;
// "Register", "Push", ...: the method as the proto names it.
const char* RpcMethodName(RpcMethod m);

// Thread-safe.
class ServerMetrics {
 public:
  ServerMetrics(prometheus::Registry& registry, uint32_t shard_index);
  // Metrics that go nowhere (a private registry), for shards without an
  // exporter: callers never test for a null sink.
  static std::unique_ptr<ServerMetrics> Unexported(uint32_t shard_index);

  // One finished RPC with its final status. A refused request (one with a
  // reason, common/rejection.h) is also counted in
  // pserver_server_rejected_requests_total{reason}: the one place where
  // rejections are counted. Its label values are the fixed set of
  // RejectReason names, all exported from the start at 0.
  void CountRequest(RpcMethod method, const absl::Status& status);
  // Payload bytes of encoded tensors and the fp32 bytes they stand for.
  void AddReceived(v1::Codec codec, uint64_t bytes, uint64_t fp32_bytes);
  void AddSent(v1::Codec codec, uint64_t bytes, uint64_t fp32_bytes);
  void AddDecodedElements(uint64_t n);
  // Workers' pushes that a completed round applied (its contributors); a
  // push summed into a round that a restart's fast-forward dropped is
  // decoded but never applied.
  void AddAppliedPushes(uint64_t n);
  void ObserveRound(double seconds);
  // A push landed in a round `staleness` versions after the one it was
  // computed on (always 0 with consistency bsp).
  void ObserveStaleness(uint64_t staleness);
  // A push arrived more stale than --max_staleness allows and was dropped.
  void AddDroppedStalePush();
  // A pull waited this long (parked) before it was answered.
  void AddPullWait(double seconds);
  // The consistency mode (server/round_policy.h): 0 bsp, 1 ssp, 2 async,
  // and ssp's bound.
  void SetConsistency(int mode, uint32_t max_staleness);
  void ObserveAggregation(double seconds);
  void ObserveOptimizer(double seconds);
  void ObservePullEncode(double seconds);
  void SetStep(uint64_t step);
  void SetStage(int stage);  // 1 warmup, 2 compression
  void SetSchedulePhase(uint32_t phase);
  // The learning rate hyper-parameter group `group` stepped with in the
  // last round (before the first: what the shard's schedule gives round 0).
  void SetLearningRate(uint32_t group, double lr);
  // How long the round waited for its last worker, and the window's
  // straggler figures (server/round_diagnostics.h).
  void ObserveStragglers(double wait_seconds, int64_t worker, double share,
                         double wait_share);
  // A finding of server/round_diagnostics.h, by its kind label.
  void CountDiagnostic(const char* kind);
  void SetWorkersRegistered(uint32_t n);
  void SetNorms(double update, double momentum, double replica_residual);
  void SetModelElements(uint64_t n);
  void AddSkippedRounds(uint64_t n);
  void SetWorkersLive(uint32_t n);
  void AddDroppedWorker();
  void AddJoinedWorker();
  void AddLeftWorker();
  // A checkpoint written (ok) or failed, and how long the write took.
  void ObserveCheckpoint(bool ok, double seconds);

 private:
  static constexpr int kCodes = 17;   // absl/gRPC status codes 0..16
  static constexpr int kCodecs = 16;  // v1::Codec values cached (others: slow path)

  prometheus::Counter& CodecChild(prometheus::Family<prometheus::Counter>& f,
                                  std::array<std::atomic<prometheus::Counter*>,
                                             kCodecs>& cache,
                                  v1::Codec codec);

  std::unique_ptr<prometheus::Registry> own_registry_;  // Unexported() only
  const std::string shard_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& bytes_received_;
  prometheus::Family<prometheus::Counter>& bytes_sent_;
  prometheus::Family<prometheus::Gauge>& compression_ratio_;
  prometheus::Counter& decoded_elements_;
  prometheus::Counter& applied_pushes_;
  prometheus::Histogram& round_seconds_;
  prometheus::Histogram& staleness_;
  prometheus::Counter& pull_wait_;
  prometheus::Counter& dropped_stale_;
  prometheus::Gauge& consistency_;
  prometheus::Gauge& max_staleness_;
  prometheus::Histogram& aggregation_seconds_;
  prometheus::Histogram& optimizer_seconds_;
  prometheus::Histogram& pull_encode_seconds_;
  prometheus::Gauge& step_;
  prometheus::Gauge& stage_;
  prometheus::Gauge& schedule_phase_;
  prometheus::Family<prometheus::Gauge>& learning_rate_;
  prometheus::Gauge& workers_registered_;
  prometheus::Gauge& update_norm_;
  prometheus::Gauge& momentum_norm_;
  prometheus::Gauge& residual_norm_;
  prometheus::Gauge& model_elements_;
  prometheus::Counter& skipped_rounds_;
  prometheus::Gauge& workers_live_;
  prometheus::Counter& last_wait_;
  prometheus::Gauge& straggler_worker_;
  prometheus::Gauge& straggler_share_;
  prometheus::Gauge& straggler_wait_share_;
  prometheus::Family<prometheus::Counter>& diagnostics_;
  prometheus::Counter& workers_dropped_;
  prometheus::Counter& workers_joined_;
  prometheus::Counter& workers_left_;
  prometheus::Histogram& checkpoint_seconds_;
  prometheus::Counter& checkpoint_failures_;
  prometheus::Gauge& checkpoint_timestamp_;
  prometheus::Gauge& push_ratio_;
  prometheus::Gauge& pull_ratio_;

  // Children built on first use and cached: Family::Add is idempotent, so
  // a race between two first uses stores the same pointer twice.
  std::array<std::array<std::atomic<prometheus::Counter*>, kCodes>,
             kRpcMethods>
      request_children_{};
  std::array<std::atomic<prometheus::Counter*>, kCodecs> received_children_{};
  std::array<std::atomic<prometheus::Counter*>, kCodecs> sent_children_{};
  // Built in the constructor for every RejectReason, indexed by its number.
  std::vector<prometheus::Counter*> rejected_children_;

  absl::Mutex mu_;
  // Totals behind the compression-ratio gauges.
  uint64_t received_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t received_fp32_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_fp32_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_METRICS_H_
