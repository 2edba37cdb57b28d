#include "server/metrics.h"

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/grpc_status.h"
#include "common/process_stats.h"
#include "common/rejection.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace pserver {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

Histogram::BucketBoundaries SecondsBuckets() {
  // 50 us .. ~100 s, factor 2.5.
  Histogram::BucketBoundaries b;
  for (double v = 5e-5; v < 120; v *= 2.5) b.push_back(v);
  return b;
}

}  // namespace

const char* RpcMethodName(RpcMethod m) {
  switch (m) {
    case RpcMethod::kRegister: return "Register";
    case RpcMethod::kPush: return "Push";
    case RpcMethod::kPull: return "Pull";
    case RpcMethod::kGetFrozenVariance: return "GetFrozenVariance";
    case RpcMethod::kGetStatus: return "GetStatus";
    case RpcMethod::kGetShardState: return "GetShardState";
    case RpcMethod::kInstallShardState: return "InstallShardState";
    case RpcMethod::kLeave: return "Leave";
  }
  return "unknown";
}

ServerMetrics::ServerMetrics(prometheus::Registry& registry,
                             uint32_t shard_index)
    : shard_(absl::StrCat(shard_index)),
      requests_(BuildCounter()
                    .Name("pserver_server_requests_total")
                    .Help("RPCs finished, by method and gRPC status code.")
                    .Register(registry)),
      rejected_(BuildCounter()
                    .Name("pserver_server_rejected_requests_total")
                    .Help("Requests refused, by reason.")
                    .Register(registry)),
      bytes_received_(BuildCounter()
                          .Name("pserver_server_received_payload_bytes_total")
                          .Help("Encoded tensor payload bytes received, by codec.")
                          .Register(registry)),
      bytes_sent_(BuildCounter()
                      .Name("pserver_server_sent_payload_bytes_total")
                      .Help("Encoded tensor payload bytes sent, by codec.")
                      .Register(registry)),
      compression_ratio_(
          BuildGauge()
              .Name("pserver_server_compression_ratio")
              .Help("fp32 bytes represented / payload bytes on the wire so "
                    "far, by direction (push, pull).")
              .Register(registry)),
      decoded_elements_(BuildCounter()
                            .Name("pserver_server_decoded_elements_total")
                            .Help("Gradient elements decoded and summed.")
                            .Register(registry)
                            .Add({{"shard", shard_}})),
      applied_pushes_(BuildCounter()
                          .Name("pserver_server_applied_pushes_total")
                          .Help("Workers' pushes applied by completed rounds "
                                "(one per contributing worker and round).")
                          .Register(registry)
                          .Add({{"shard", shard_}})),
      round_seconds_(BuildHistogram()
                         .Name("pserver_server_round_duration_seconds")
                         .Help("From a round's first push to its weights "
                               "being pullable.")
                         .Register(registry)
                         .Add({{"shard", shard_}}, SecondsBuckets())),
      staleness_(BuildHistogram()
                     .Name("pserver_server_push_staleness")
                     .Help("Versions between the weights a push was computed "
                           "on and the round it landed in (0 under bsp).")
                     .Register(registry)
                     .Add({{"shard", shard_}},
                          Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12,
                                                      16, 32, 64})),
      pull_wait_(BuildCounter()
                     .Name("pserver_server_pull_wait_seconds_total")
                     .Help("Seconds pulls spent parked until their round "
                           "completed: the time workers waited for others.")
                     .Register(registry)
                     .Add({{"shard", shard_}})),
      dropped_stale_(BuildCounter()
                         .Name("pserver_server_stale_pushes_dropped_total")
                         .Help("Pushes that arrived more stale than "
                               "--max_staleness allows and were dropped, "
                               "not applied.")
                         .Register(registry)
                         .Add({{"shard", shard_}})),
      consistency_(BuildGauge()
                       .Name("pserver_server_consistency_mode")
                       .Help("0 bsp, 1 ssp (bounded staleness), 2 async.")
                       .Register(registry)
                       .Add({{"shard", shard_}})),
      max_staleness_(BuildGauge()
                         .Name("pserver_server_max_staleness")
                         .Help("The ssp bound on a push's staleness (0 for "
                               "bsp and async).")
                         .Register(registry)
                         .Add({{"shard", shard_}})),
      aggregation_seconds_(
          BuildHistogram()
              .Name("pserver_server_aggregation_duration_seconds")
              .Help("Decoding and summing one push.")
              .Register(registry)
              .Add({{"shard", shard_}}, SecondsBuckets())),
      optimizer_seconds_(BuildHistogram()
                             .Name("pserver_server_optimizer_duration_seconds")
                             .Help("One optimizer step over the shard.")
                             .Register(registry)
                             .Add({{"shard", shard_}}, SecondsBuckets())),
      pull_encode_seconds_(
          BuildHistogram()
              .Name("pserver_server_pull_encode_duration_seconds")
              .Help("Encoding the pull delta and updating the replica.")
              .Register(registry)
              .Add({{"shard", shard_}}, SecondsBuckets())),
      step_(BuildGauge()
                .Name("pserver_server_step")
                .Help("Completed optimizer rounds.")
                .Register(registry)
                .Add({{"shard", shard_}})),
      stage_(BuildGauge()
                 .Name("pserver_server_optimizer_stage")
                 .Help("1 = warmup (plain Adam), 2 = compression (v frozen).")
                 .Register(registry)
                 .Add({{"shard", shard_}})),
      schedule_phase_(BuildGauge()
                          .Name("pserver_server_schedule_phase")
                          .Help("The compression schedule's phase of the "
                                "round in progress (0 without --schedule).")
                          .Register(registry)
                          .Add({{"shard", shard_}})),
      learning_rate_(BuildGauge()
                         .Name("pserver_server_learning_rate")
                         .Help("The learning rate of the last round, per "
                               "hyper-parameter group (the shard's "
                               "--lr schedule, or what the workers pushed).")
                         .Register(registry)),
      workers_registered_(BuildGauge()
                              .Name("pserver_server_workers_registered")
                              .Help("Workers that have registered.")
                              .Register(registry)
                              .Add({{"shard", shard_}})),
      update_norm_(BuildGauge()
                       .Name("pserver_server_update_norm")
                       .Help("L2 norm of the last weight update.")
                       .Register(registry)
                       .Add({{"shard", shard_}})),
      momentum_norm_(BuildGauge()
                         .Name("pserver_server_momentum_norm")
                         .Help("L2 norm of the optimizer momentum.")
                         .Register(registry)
                         .Add({{"shard", shard_}})),
      residual_norm_(BuildGauge()
                         .Name("pserver_server_replica_residual_norm")
                         .Help("L2 norm of x - x_hat after the last pull "
                               "delta (the downlink error feedback).")
                         .Register(registry)
                         .Add({{"shard", shard_}})),
      model_elements_(BuildGauge()
                          .Name("pserver_server_shard_elements")
                          .Help("Parameters this shard owns.")
                          .Register(registry)
                          .Add({{"shard", shard_}})),
      skipped_rounds_(BuildCounter()
                          .Name("pserver_server_skipped_rounds_total")
                          .Help("Rounds this shard skipped to catch up with "
                                "workers after a restart (lost updates).")
                          .Register(registry)
                          .Add({{"shard", shard_}})),
      workers_live_(BuildGauge()
                        .Name("pserver_server_workers_live")
                        .Help("Workers the rounds wait for (leases not expired).")
                        .Register(registry)
                        .Add({{"shard", shard_}})),
      last_wait_(BuildCounter()
                     .Name("pserver_server_last_arrival_wait_seconds_total")
                     .Help("Time rounds waited for their last worker's push "
                           "after the second-to-last one's.")
                     .Register(registry)
                     .Add({{"shard", shard_}})),
      straggler_worker_(BuildGauge()
                            .Name("pserver_server_straggler_worker")
                            .Help("The worker whose push arrived last most "
                                  "often in the last 100 rounds (-1: none "
                                  "yet).")
                            .Register(registry)
                            .Add({{"shard", shard_}})),
      straggler_share_(BuildGauge()
                           .Name("pserver_server_straggler_last_share")
                           .Help("That worker's share of the last 100 "
                                 "rounds' last arrivals, 0..1.")
                           .Register(registry)
                           .Add({{"shard", shard_}})),
      straggler_wait_share_(
          BuildGauge()
              .Name("pserver_server_straggler_wait_share")
              .Help("Share of the last 100 rounds' time spent waiting for "
                    "that worker after every other push was in, 0..1.")
              .Register(registry)
              .Add({{"shard", shard_}})),
      diagnostics_(BuildCounter()
                       .Name("pserver_server_diagnostics_total")
                       .Help("Conditions the shard reported (logged once per "
                             "occurrence), by kind: straggler, "
                             "update_blowup, overflow_skip.")
                       .Register(registry)),
      workers_dropped_(BuildCounter()
                           .Name("pserver_server_workers_dropped_total")
                           .Help("Workers dropped from the rounds after their "
                                 "lease expired.")
                           .Register(registry)
                           .Add({{"shard", shard_}})),
      workers_joined_(BuildCounter()
                          .Name("pserver_server_workers_joined_total")
                          .Help("Workers that joined the running job in a "
                                "slot beyond --initial_workers.")
                          .Register(registry)
                          .Add({{"shard", shard_}})),
      workers_left_(BuildCounter()
                        .Name("pserver_server_workers_left_total")
                        .Help("Workers that left the rounds when told to stop "
                              "(Leave): a planned leave, not a drop.")
                        .Register(registry)
                        .Add({{"shard", shard_}})),
      checkpoint_seconds_(BuildHistogram()
                              .Name("pserver_server_checkpoint_duration_seconds")
                              .Help("Writing one checkpoint (fsync included).")
                              .Register(registry)
                              .Add({{"shard", shard_}}, SecondsBuckets())),
      checkpoint_failures_(BuildCounter()
                               .Name("pserver_server_checkpoint_failures_total")
                               .Help("Checkpoint writes that failed.")
                               .Register(registry)
                               .Add({{"shard", shard_}})),
      checkpoint_timestamp_(
          BuildGauge()
              .Name("pserver_server_last_checkpoint_timestamp_seconds")
              .Help("Unix time of the last checkpoint written (0: none); "
                    "checkpoint age = time() - this.")
              .Register(registry)
              .Add({{"shard", shard_}})),
      push_ratio_(compression_ratio_.Add({{"shard", shard_}, {"direction", "push"}})),
      pull_ratio_(compression_ratio_.Add({{"shard", shard_}, {"direction", "pull"}})) {
  straggler_worker_.Set(-1);
  for (const char* kind : {"straggler", "update_blowup"}) {
    diagnostics_.Add({{"shard", shard_}, {"kind", kind}});  // 0 until found
  }
  BuildGauge()
      .Name("pserver_build_info")
      .Help("Always 1; labels name the build.")
      .Register(registry)
      .Add({{"version", "0.1.0"}, {"component", "server"},
            {"malloc", std::string(AllocatorName())}})
      .Set(1);
  for (v1::RejectReason r : AllRejectReasons()) {
    if (static_cast<size_t>(r) >= rejected_children_.size()) {
      rejected_children_.resize(static_cast<size_t>(r) + 1, nullptr);
    }
    rejected_children_[r] =
        &rejected_.Add({{"shard", shard_}, {"reason", ReasonLabel(r)}});
  }
}

std::unique_ptr<ServerMetrics> ServerMetrics::Unexported(uint32_t shard_index) {
  auto registry = std::make_unique<prometheus::Registry>();
  auto m = std::make_unique<ServerMetrics>(*registry, shard_index);
  m->own_registry_ = std::move(registry);
  return m;
}

void ServerMetrics::CountRequest(RpcMethod method, const absl::Status& status) {
  const int code = static_cast<int>(status.code());
  if (code >= 0 && code < kCodes) {
    std::atomic<prometheus::Counter*>& slot =
        request_children_[static_cast<int>(method)][code];
    prometheus::Counter* c = slot.load(std::memory_order_acquire);
    if (c == nullptr) {
      c = &requests_.Add({{"shard", shard_},
                          {"method", RpcMethodName(method)},
                          {"code", GrpcCodeName(status.code())}});
      slot.store(c, std::memory_order_release);
    }
    c->Increment();
  }
  const v1::RejectReason reason = ReasonOf(status);
  if (reason != v1::REJECT_REASON_UNSPECIFIED &&
      static_cast<size_t>(reason) < rejected_children_.size() &&
      rejected_children_[reason] != nullptr) {
    rejected_children_[reason]->Increment();
  }
}

prometheus::Counter& ServerMetrics::CodecChild(
    prometheus::Family<prometheus::Counter>& f,
    std::array<std::atomic<prometheus::Counter*>, kCodecs>& cache,
    v1::Codec codec) {
  const int i = static_cast<int>(codec);
  if (i < 0 || i >= kCodecs) {
    return f.Add({{"shard", shard_}, {"codec", CodecName(codec)}});
  }
  prometheus::Counter* c = cache[i].load(std::memory_order_acquire);
  if (c == nullptr) {
    c = &f.Add({{"shard", shard_}, {"codec", CodecName(codec)}});
    cache[i].store(c, std::memory_order_release);
  }
  return *c;
}

void ServerMetrics::AddReceived(v1::Codec codec, uint64_t bytes,
                                uint64_t fp32_bytes) {
  CodecChild(bytes_received_, received_children_, codec)
      .Increment(static_cast<double>(bytes));
  absl::MutexLock l(&mu_);
  received_bytes_ += bytes;
  received_fp32_ += fp32_bytes;
  if (received_bytes_ > 0) {
    push_ratio_.Set(static_cast<double>(received_fp32_) / received_bytes_);
  }
}

void ServerMetrics::AddSent(v1::Codec codec, uint64_t bytes,
                            uint64_t fp32_bytes) {
  CodecChild(bytes_sent_, sent_children_, codec)
      .Increment(static_cast<double>(bytes));
  absl::MutexLock l(&mu_);
  sent_bytes_ += bytes;
  sent_fp32_ += fp32_bytes;
  if (sent_bytes_ > 0) {
    pull_ratio_.Set(static_cast<double>(sent_fp32_) / sent_bytes_);
  }
}

void ServerMetrics::AddDecodedElements(uint64_t n) {
  decoded_elements_.Increment(static_cast<double>(n));
}
void ServerMetrics::AddAppliedPushes(uint64_t n) {
  applied_pushes_.Increment(static_cast<double>(n));
}
void ServerMetrics::ObserveRound(double s) { round_seconds_.Observe(s); }
void ServerMetrics::ObserveStaleness(uint64_t staleness) {
  staleness_.Observe(static_cast<double>(staleness));
}
void ServerMetrics::AddPullWait(double s) { pull_wait_.Increment(s); }
void ServerMetrics::AddDroppedStalePush() { dropped_stale_.Increment(); }
void ServerMetrics::SetConsistency(int mode, uint32_t max_staleness) {
  consistency_.Set(mode);
  max_staleness_.Set(max_staleness);
}
void ServerMetrics::ObserveAggregation(double s) {
  aggregation_seconds_.Observe(s);
}
void ServerMetrics::ObserveOptimizer(double s) { optimizer_seconds_.Observe(s); }
void ServerMetrics::ObservePullEncode(double s) {
  pull_encode_seconds_.Observe(s);
}
void ServerMetrics::SetStep(uint64_t step) {
  step_.Set(static_cast<double>(step));
}
void ServerMetrics::SetStage(int stage) { stage_.Set(stage); }
void ServerMetrics::SetSchedulePhase(uint32_t phase) {
  schedule_phase_.Set(phase);
}
void ServerMetrics::SetLearningRate(uint32_t group, double lr) {
  learning_rate_.Add({{"shard", shard_}, {"group", absl::StrCat(group)}})
      .Set(lr);
}
void ServerMetrics::SetWorkersRegistered(uint32_t n) {
  workers_registered_.Set(n);
}
void ServerMetrics::SetNorms(double update, double momentum, double residual) {
  update_norm_.Set(update);
  momentum_norm_.Set(momentum);
  residual_norm_.Set(residual);
}
void ServerMetrics::SetWorkersLive(uint32_t n) { workers_live_.Set(n); }
void ServerMetrics::AddDroppedWorker() { workers_dropped_.Increment(); }
void ServerMetrics::AddJoinedWorker() { workers_joined_.Increment(); }
void ServerMetrics::AddLeftWorker() { workers_left_.Increment(); }

void ServerMetrics::ObserveStragglers(double wait_seconds, int64_t worker,
                                      double share, double wait_share) {
  last_wait_.Increment(wait_seconds);
  straggler_worker_.Set(static_cast<double>(worker));
  straggler_share_.Set(share);
  straggler_wait_share_.Set(wait_share);
}

void ServerMetrics::CountDiagnostic(const char* kind) {
  diagnostics_.Add({{"shard", shard_}, {"kind", kind}}).Increment();
}
void ServerMetrics::AddSkippedRounds(uint64_t n) {
  skipped_rounds_.Increment(static_cast<double>(n));
}
void ServerMetrics::ObserveCheckpoint(bool ok, double seconds) {
  if (!ok) {
    checkpoint_failures_.Increment();
    return;
  }
  checkpoint_seconds_.Observe(seconds);
  checkpoint_timestamp_.Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
}
void ServerMetrics::SetModelElements(uint64_t n) {
  model_elements_.Set(static_cast<double>(n));
}

}  // namespace pserver
