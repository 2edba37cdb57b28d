#include "server/replica_tracker.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "common/checksum.h"
#include "common/fp32_tensor.h"
#include "common/mix.h"
#include "server/optimizer.h"

namespace pserver {
namespace {

// The seed of a pull delta's encoder (stochastic rounding, randomk): the same
// on every run for the same shard and step.
uint64_t PullSeed(uint32_t shard, uint64_t step) {
  return Mix64((uint64_t{shard} << 48) ^ step ^ 0x5DEECE66DULL);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReplicaTracker>> ReplicaTracker::Create(
    uint32_t shard_index, v1::Codec pull_codec,
    const v1::CodecParams& pull_params, ThreadPool* pool) {
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      MakeCodec(pull_codec, pull_params);
  if (!codec.ok()) return codec.status();
  return std::unique_ptr<ReplicaTracker>(new ReplicaTracker(
      shard_index, pull_codec, std::move(codec).value(), pool));
}

ReplicaTracker::ReplicaTracker(uint32_t shard_index, v1::Codec pull_codec,
                               std::unique_ptr<Codec> codec, ThreadPool* pool)
    : shard_index_(shard_index),
      pull_codec_id_(pull_codec),
      codec_(std::move(codec)),
      pool_(pool) {}

void ReplicaTracker::DropAnswers() {
  delta_answer_.reset();
  snapshot_answer_.reset();
}

void ReplicaTracker::Reset(absl::Span<const float> x) {
  x_hat_.assign(x.begin(), x.end());
  delta_.reset();
  checksum_ = ChecksumOf(x_hat_);
  prev_checksum_ = checksum_;
  DropAnswers();
}

void ReplicaTracker::Restore(std::vector<float> x_hat,
                             std::optional<v1::EncodedTensor> delta,
                             uint64_t checksum, uint64_t prev_checksum) {
  x_hat_ = std::move(x_hat);
  delta_ = std::move(delta);
  checksum_ = checksum;
  prev_checksum_ = prev_checksum;
  DropAnswers();
}

void ReplicaTracker::Invalidate() {
  delta_.reset();
  prev_checksum_ = checksum_;
  DropAnswers();
}

double ReplicaTracker::Advance(absl::Span<const float> x, uint64_t step,
                               absl::Span<float> scratch) {
  DropAnswers();
  prev_checksum_ = checksum_;
  double residual_norm = 0;
  const uint64_t n = x.size();
  if (pull_codec_id_ == v1::CODEC_FP32) {
    x_hat_.assign(x.begin(), x.end());
    delta_.reset();
  } else {
    const float* xp = x.data();
    const float* hat = x_hat_.data();
    float* diff = scratch.data();
    pool_->ParallelFor(n, kMinParallelChunk, [=](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) diff[i] = xp[i] - hat[i];
    });
    v1::EncodedTensor d;
    absl::Status s = codec_->Encode(scratch, PullSeed(shard_index_, step), &d);
    if (s.ok()) s = codec_->DecodeAccumulate(d, 1.0f, absl::MakeSpan(x_hat_));
    if (s.ok()) {
      delta_ = std::move(d);
    } else {
      // Non-finite weights (a diverged run): pulls fall back to snapshots.
      std::fprintf(stderr, "pserver: shard %u step %lu: pull encode failed: %s\n",
                   shard_index_, static_cast<unsigned long>(step),
                   std::string(s.message()).c_str());
      delta_.reset();
    }
    for (uint64_t i = 0; i < n; ++i) {
      double r = double{x[i]} - x_hat_[i];
      residual_norm += r * r;
    }
    residual_norm = std::sqrt(residual_norm);
  }
  checksum_ = ChecksumOf(x_hat_);
  return residual_norm;
}

PullAnswer ReplicaTracker::Answer(const v1::PullRequest& req, uint64_t step,
                                  v1::OptimizerStage stage) {
  if (answers_step_ != step || answers_stage_ != stage) {
    DropAnswers();
    answers_step_ = step;
    answers_stage_ = stage;
  }
  const bool delta_ok = delta_.has_value() && !req.want_snapshot() &&
                        req.step() == step &&
                        req.replica_step() == static_cast<int64_t>(step) - 1 &&
                        req.replica_checksum() == prev_checksum_;
  PullAnswer& cached = delta_ok ? delta_answer_ : snapshot_answer_;
  if (cached == nullptr) {
    auto resp = std::make_shared<v1::PullResponse>();
    resp->set_step(step);
    resp->set_stage(stage);
    resp->set_replica_checksum(checksum_);
    if (delta_ok) {
      resp->set_kind(v1::PULL_KIND_DELTA);
      *resp->mutable_weights() = *delta_;
    } else {
      resp->set_kind(v1::PULL_KIND_SNAPSHOT);
      SetFp32(x_hat_, resp->mutable_weights());
    }
    cached = std::move(resp);
  }
  return cached;
}

}  // namespace pserver
