// Shard: its configuration checked (ValidateShardConfig), the compression
// schedule resolved, creation from a config or a checkpoint, and the checks
// every request of a worker passes first. The push path of a round is in
// shard.cc; the other methods live by concept in shard_membership.cc,
// shard_pulls.cc and shard_state.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/rejection.h"
#include "server/checkpoint.h"
#include "server/shard.h"

namespace pserver {
bool Shard::ExpectsMomentum() const {
  return WorkerMomentumBeta(opt_) > 0 &&
         optimizer_->stage() == v1::OPTIMIZER_STAGE_COMPRESSION;
}

CheckpointExpectation Shard::Expectation() const {
  CheckpointExpectation expect;
  expect.shard_index = config_.shard_index;
  expect.num_shards = config_.num_shards;
  expect.num_workers = config_.num_workers;
  expect.optimizer_kind = static_cast<uint32_t>(config_.optimizer.kind);
  expect.preconditioned = config_.optimizer.preconditioned;
  expect.worker_momentum = config_.optimizer.worker_momentum;
  expect.schedule_fingerprint =
      config_.schedule != nullptr ? config_.schedule->fingerprint() : 0;
  // freeze_step is not compared: a shard that fast-forwarded from a fresh
  // start saves its shifted freeze step, which a restart must accept.
  if (config_.beta1_given) expect.beta1 = config_.optimizer.beta1;
  if (config_.beta2_given) expect.beta2 = config_.optimizer.beta2;
  if (config_.eps_given) expect.eps = config_.optimizer.eps;
  return expect;
}

v1::Codec JobPushCodec(const ShardConfig& c) {
  if (c.push_codec != v1::CODEC_UNSPECIFIED) return c.push_codec;
  // 1-bit Adam exists to compress its pushes; plain Adam and SGD are the
  // exact baselines.
  return c.optimizer.kind == OptimizerKind::kOneBitAdam ? v1::CODEC_ONEBIT
                                                       : v1::CODEC_FP32;
}

std::string JobPushCodecSource(const ShardConfig& c) {
  if (c.push_codec != v1::CODEC_UNSPECIFIED) {
    return absl::StrCat("--push_codec=", CodecName(c.push_codec));
  }
  return absl::StrCat("the default of --optimizer=",
                      OptimizerName(c.optimizer.kind));
}

absl::Status ValidateShardConfig(const ShardConfig& c) {
  if (c.num_shards == 0) {
    return absl::InvalidArgumentError("num_shards is 0; expected >= 1");
  }
  if (c.shard_index >= c.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_index is ", c.shard_index, "; expected 0..",
                     c.num_shards - 1));
  }
  if (c.num_workers == 0 || c.num_workers > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_workers is ", c.num_workers, "; expected 1..4096"));
  }
  if (c.initial_workers > c.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_workers is ", c.initial_workers, "; expected 0..",
        c.num_workers, " (num_workers: the slots workers may join)"));
  }
  if (c.max_model_elements == 0 ||
      c.max_model_elements > kDefaultMaxModelElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_model_elements is ", c.max_model_elements,
                     "; expected 1..", kDefaultMaxModelElements));
  }
  if (c.chunk_elements < kMinChunkElements ||
      c.chunk_elements > kMaxChunkElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_elements is ", c.chunk_elements, "; expected ",
                     kMinChunkElements, "..", kMaxChunkElements));
  }
  if (c.local_steps > kMaxJobLocalSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_steps is ", c.local_steps, "; expected 0..",
                     kMaxJobLocalSteps, " (0: any)"));
  }
  if (c.schedule != nullptr) {
    // With an fp32 pull codec the replica is x itself (no x_hat array), so
    // a schedule may not switch between fp32 and compressed pulls.
    const bool fp32 = c.pull_codec == v1::CODEC_FP32;
    for (size_t p = 0; p < c.schedule->num_phases(); ++p) {
      const CodecChoiceSpec* pull = c.schedule->pull(p);
      if (pull != nullptr && (pull->codec == v1::CODEC_FP32) != fp32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "schedule phase ", p, " pulls with ", CodecName(pull->codec),
            " but --pull_codec is ", CodecName(c.pull_codec),
            "; expected fp32 pulls in every phase or in none (use bf16 for "
            "near-exact compressed pulls)"));
      }
    }
    if (fp32 && c.schedule->has_tensor_pulls()) {
      return absl::InvalidArgumentError(
          "the schedule gives tensors pull codecs of their own but "
          "--pull_codec is fp32; expected a compressed --pull_codec (with "
          "fp32 pulls the shard keeps no replica to encode against; use bf16 "
          "for near-exact pulls)");
    }
  }
  if (absl::Status s = ValidateConsistencyConfig(c.consistency); !s.ok()) {
    return s;
  }
  return ValidateOptimizerConfig(c.optimizer);
}

uint32_t Shard::PhaseAt(uint64_t step) const {
  return schedule_.has_value()
             ? static_cast<uint32_t>(schedule_->PhaseAt(step))
             : 0;
}

absl::StatusOr<std::optional<ResolvedSchedule>> Shard::ResolveSchedule(
    uint64_t total_steps) const {
  if (config_.schedule == nullptr) return std::optional<ResolvedSchedule>();
  absl::StatusOr<ResolvedSchedule> r =
      ResolvedSchedule::Make(config_.schedule, total_steps);
  if (!r.ok()) {
    return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                  absl::FailedPreconditionError(
                      absl::StrCat("schedule: ", r.status().message())));
  }
  return std::optional<ResolvedSchedule>(*std::move(r));
}

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(const ShardConfig& config,
                                                     ShardEnv env) {
  if (absl::Status s = ValidateShardConfig(config); !s.ok()) return s;
  ThreadPool* pool = env.pool != nullptr ? env.pool : ThreadPool::Default();
  absl::StatusOr<std::unique_ptr<ReplicaTracker>> replica =
      ReplicaTracker::Create(config.shard_index, config.pull_codec,
                             config.pull_params, pool);
  if (!replica.ok()) return replica.status();
  env.pool = pool;
  std::unique_ptr<Shard> shard(
      new Shard(config, env, std::move(replica).value()));
  if (!config.checkpoint_dir.empty()) {
    std::vector<std::string> refused;
    absl::StatusOr<ShardState> state = LoadNewestCheckpoint(
        config.checkpoint_dir, shard->Expectation(), &refused);
    for (const std::string& r : refused) {
      shard->startup_log_.push_back(absl::StrCat("refused checkpoint ", r));
    }
    if (absl::IsFailedPrecondition(state.status())) return state.status();
    if (state.ok()) {
      uint64_t step = state->step;
      if (absl::Status s = shard->RestoreFrom(*std::move(state)); !s.ok()) {
        return s;
      }
      shard->startup_log_.push_back(absl::StrCat(
          "restored step ", step, " from ", config.checkpoint_dir));
    } else {
      shard->startup_log_.push_back(absl::StrCat(
          "no usable checkpoint in ", config.checkpoint_dir, "; starting fresh"));
    }
    shard->writer_ = std::make_unique<CheckpointWriter>(
        config.checkpoint_dir, config.shard_index,
        /*background=*/config.checkpoint_every > 0, shard->metrics_);
  } else {
    shard->startup_log_.push_back("no checkpoint_dir; starting fresh");
  }
  if (config.lease_timeout > absl::ZeroDuration()) {
    Shard* self = shard.get();
    shard->reaper_ = std::make_unique<std::thread>([self] { self->ReaperLoop(); });
  }
  if (shard->policy_.relaxed()) {
    // Workers skip steps under ssp and async: recent deltas answer them.
    const uint64_t keep = std::min<uint64_t>(
        64, std::max<uint64_t>(uint64_t{config.consistency.max_staleness} + 2,
                               uint64_t{4} * config.num_workers));
    absl::MutexLock lock(&shard->mu_);
    shard->replica_->KeepHistory(static_cast<uint32_t>(keep));
  }
  shard->metrics_->SetConsistency(static_cast<int>(config.consistency.mode),
                                  config.consistency.max_staleness);
  {
    absl::MutexLock lock(&shard->mu_);
    shard->round_open_ = shard->clock_->Now();
  }
  if (shard->policy_.has_patience()) {
    Shard* self = shard.get();
    shard->timer_ = std::make_unique<std::thread>([self] { self->TimerLoop(); });
  }
  return shard;
}

Shard::Shard(const ShardConfig& config, ShardEnv env,
             std::unique_ptr<ReplicaTracker> replica)
    : config_(config),
      own_metrics_(env.metrics == nullptr
                       ? ServerMetrics::Unexported(config.shard_index)
                       : nullptr),
      metrics_(env.metrics != nullptr ? env.metrics : own_metrics_.get()),
      clock_(env.clock != nullptr ? env.clock : Clock::Real()),
      pool_(env.pool),
      policy_(config.consistency),
      opt_(config.optimizer),
      worker_registered_(config.num_workers, false),
      last_pushed_(config.num_workers, -1),
      landed_(config.num_workers, -1),
      version_(config.num_workers, 0),
      late_(config.num_workers, false),
      deferred_(config.num_workers),
      replica_(std::move(replica)),
      round_(config.num_workers, env.pool),
      diagnostics_(config.num_workers),
      leases_(config.num_workers, config.initial_workers, config.lease_timeout,
              clock_) {}

absl::Status Shard::CheckWorker(uint32_t worker_id) const {
  if (worker_id >= config_.num_workers) {
    return Reject(v1::REJECT_REASON_UNKNOWN_WORKER,
                  absl::InvalidArgumentError(absl::StrCat(
                      "worker_id is ", worker_id, "; expected 0..",
                      config_.num_workers - 1, " (the shard expects ",
                      config_.num_workers, " workers)")));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckChunk(uint32_t c) const {
  if (c < round_.num_chunks()) return absl::OkStatus();
  return Reject(v1::REJECT_REASON_INVALID_FIELD,
                absl::InvalidArgumentError(absl::StrCat(
                    "chunk is ", c, "; expected 0..", round_.num_chunks() - 1,
                    " (the slice's ", range_.size(), " elements in chunks of ",
                    config_.chunk_elements, ")")));
}

}  // namespace pserver
