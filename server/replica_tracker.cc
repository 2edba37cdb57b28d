#include "server/replica_tracker.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "common/checksum.h"
#include "common/validated_tensor.h"
#include "common/fp32_tensor.h"
#include "common/mix.h"
#include "common/norms.h"
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
      active_(codec_.get()),
      pool_(pool) {}

void ReplicaTracker::DropAnswers() {
  delta_answers_.assign(plan_.num_chunks(), nullptr);
  snapshot_answers_.assign(plan_.num_chunks(), {});
}

void ReplicaTracker::TrimHistory() {
  // At most history_limit_ rounds, together smaller than a snapshot.
  const uint64_t cap = Fp32Bytes(plan_.n);
  while (!history_.empty() &&
         (history_.size() > history_limit_ || history_bytes_ > cap)) {
    history_bytes_ -= history_.front().bytes;
    history_.pop_front();
  }
}

void ReplicaTracker::Reset(absl::Span<const float> x, uint64_t chunk_elements) {
  history_.clear();
  skipped_step_ = 0;
  history_bytes_ = 0;
  plan_.n = x.size();
  plan_.chunk_elements = chunk_elements;
  if (pull_codec_id_ == v1::CODEC_FP32) {
    x_hat_.clear();
    x_hat_.shrink_to_fit();
    hat_ = x;
  } else {
    x_hat_.assign(x.begin(), x.end());
    hat_ = x_hat_;
  }
  delta_.clear();
  checksum_ = ChecksumOf(hat_);
  prev_checksum_ = checksum_;
  DropAnswers();
}

void ReplicaTracker::Restore(std::vector<float> x_hat,
                             std::vector<v1::EncodedTensor> delta,
                             uint64_t checksum, uint64_t prev_checksum) {
  plan_.n = x_hat.size();
  if (pull_codec_id_ == v1::CODEC_FP32) {
    // x_hat is x (the view Reset took), whatever codec the checkpoint was
    // written with: snapshots carry x's checksum.
    checksum = ChecksumOf(hat_);
    prev_checksum = checksum;
  } else {
    x_hat_ = std::move(x_hat);
    hat_ = x_hat_;
  }
  history_.clear();
  history_bytes_ = 0;
  bool fits = delta.size() == plan_.num_chunks();
  for (uint32_t c = 0; fits && c < delta.size(); ++c) {
    fits = ValidateTensor(delta[c], plan_.size(c)).ok();
  }
  delta_ = fits ? std::move(delta) : std::vector<v1::EncodedTensor>();
  checksum_ = checksum;
  prev_checksum_ = prev_checksum;
  DropAnswers();
}

void ReplicaTracker::Invalidate() {
  delta_.clear();
  history_.clear();
  history_bytes_ = 0;
  prev_checksum_ = checksum_;
  DropAnswers();
}

double ReplicaTracker::Advance(absl::Span<const float> x, uint64_t step,
                               absl::Span<float> scratch) {
  return Advance(x, step, scratch, /*norm=*/true);
}

double ReplicaTracker::Advance(absl::Span<const float> x, uint64_t step,
                               absl::Span<float> scratch, bool norm) {
  DropAnswers();
  prev_checksum_ = checksum_;
  double residual_norm = 0;
  if (pull_codec_id_ == v1::CODEC_FP32) {
    hat_ = x;  // updated in place by the optimizer
    delta_.clear();
  } else {
    const float* xp = x.data();
    const float* hat = x_hat_.data();
    // Each chunk is encoded on its own (and decoded into x_hat) on the
    // pool's threads; the seed depends on the chunk, so the result does not
    // depend on which thread ran it. A thread forms each chunk's x - x_hat
    // just before encoding it, in one chunk-sized piece of the scratch (its
    // first chunk's), so the difference is read back from the cache, not
    // from memory.
    const uint32_t chunks = plan_.num_chunks();
    std::vector<v1::EncodedTensor> d(chunks);
    std::vector<absl::Status> status(chunks);
    pool_->ParallelFor(chunks, 1, [&](uint64_t b, uint64_t e) {
      // The first chunk is the largest of [b, e) (only the last chunk of
      // the slice is shorter).
      float* const diff = scratch.data() + plan_.begin(static_cast<uint32_t>(b));
      for (uint64_t c = b; c < e; ++c) {
        const uint32_t ci = static_cast<uint32_t>(c);
        const uint64_t at = plan_.begin(ci), len = plan_.size(ci);
        for (uint64_t i = 0; i < len; ++i) diff[i] = xp[at + i] - hat[at + i];
        const uint64_t seed =
            c == 0 ? PullSeed(shard_index_, step)
                   : Mix64(PullSeed(shard_index_, step) ^ (c << 20));
        status[c] = EncodeWithPlan(tensor_plan_, *active_, /*ef=*/nullptr, at,
                                   absl::MakeSpan(diff, len), seed, &d[c]);
        // Before x_hat takes it (below), so x_hat is what workers decode.
        if (status[c].ok()) {
          MarkUnchanged(&d[c], at, buffers_, [](uint64_t, absl::string_view b) {
            return AllZero(b);
          });
        }
      }
    });
    absl::Status s;
    for (const absl::Status& st : status) {
      if (!st.ok()) {
        s = st;
        break;
      }
    }
    if (s.ok()) {
      absl::Span<float> hat_out = absl::MakeSpan(x_hat_);
      pool_->ParallelFor(chunks, 1, [&](uint64_t b, uint64_t e) {
        for (uint64_t c = b; c < e; ++c) {
          const uint32_t ci = static_cast<uint32_t>(c);
          // The codec's own output: accumulating it cannot fail.
          status[c] = DecoderFor(d[c].codec())->DecodeAccumulate(
              d[c], 1.0f, hat_out.subspan(plan_.begin(ci), plan_.size(ci)));
        }
      });
      delta_ = std::move(d);
      if (history_limit_ > 0) {
        Past past;
        past.step = step;
        past.prev_checksum = prev_checksum_;
        past.delta = delta_;
        for (const v1::EncodedTensor& t : past.delta) {
          past.bytes += PayloadBytes(t);
        }
        history_bytes_ += past.bytes;
        history_.push_back(std::move(past));
        TrimHistory();
      }
    } else {
      history_.clear();
      history_bytes_ = 0;
      // Non-finite weights (a diverged run): pulls fall back to snapshots.
      std::fprintf(stderr, "pserver: shard %u step %lu: pull encode failed: %s\n",
                   shard_index_, static_cast<unsigned long>(step),
                   std::string(s.message()).c_str());
      delta_.clear();
    }
    if (norm) residual_norm = std::sqrt(SquaredDistance(x, x_hat_, pool_));
  }
  checksum_ = ChecksumOf(hat_);
  return residual_norm;
}

PullAnswer ReplicaTracker::Answer(const v1::PullRequest& req, uint64_t step,
                                  v1::OptimizerStage stage,
                                  uint32_t phase) {
  if (answers_step_ != step || answers_stage_ != stage) {
    DropAnswers();
    answers_step_ = step;
    answers_stage_ = stage;
  }
  const uint32_t c = req.chunk();
  if (!req.want_snapshot() && req.step() == step &&
      req.replica_step() == static_cast<int64_t>(step) &&
      req.replica_checksum() == checksum_) {
    // The worker holds x_hat(step) already (it registered with the weights
    // installed here): nothing to send.
    v1::PullResponse header = AnswerHeader(step, stage, phase, c);
    header.set_kind(v1::PULL_KIND_CURRENT);
    v1::EncodedTensor head;
    head.set_codec(v1::CODEC_FP32);
    return MakePullAnswer(header, head, absl::string_view());
  }
  if (PullAnswer a = AnswerFromHistory(req, step, stage, phase)) {
    return a;
  }
  const bool delta_ok = !delta_.empty() && !req.want_snapshot() &&
                        req.step() == step &&
                        req.replica_step() == static_cast<int64_t>(step) - 1 &&
                        req.replica_checksum() == prev_checksum_;
  PullAnswer cached =
      delta_ok ? delta_answers_[c] : snapshot_answers_[c].lock();
  if (cached == nullptr) {
    v1::PullResponse header = AnswerHeader(step, stage, phase, c);
    if (delta_ok) {
      cached = DeltaAnswer(std::move(header), delta_[c]);
    } else {
      header.set_kind(v1::PULL_KIND_SNAPSHOT);
      v1::EncodedTensor head;
      head.set_codec(v1::CODEC_FP32);
      head.set_num_elements(plan_.size(c));
      const float* begin = hat_.data() + plan_.begin(c);
      cached = MakePullAnswer(
          header, head,
          absl::string_view(reinterpret_cast<const char*>(begin),
                            Fp32Bytes(plan_.size(c))));
    }
    if (delta_ok) {
      delta_answers_[c] = cached;
    } else {
      snapshot_answers_[c] = cached;
    }
  }
  return cached;
}

PullAnswer ReplicaTracker::AnswerFromHistory(const v1::PullRequest& req,
                                             uint64_t step,
                                             v1::OptimizerStage stage,
                                             uint32_t phase) {
  if (history_.empty() || req.want_snapshot() || delta_.empty() ||
      history_.back().step != step) {
    return nullptr;
  }
  // Two or more steps behind (one behind is the shared delta answer).
  const int64_t from = req.replica_step();
  if (from < 0 || static_cast<uint64_t>(from) + 2 > step ||
      static_cast<uint64_t>(from) + 1 < history_.front().step) {
    return nullptr;
  }
  const size_t first = history_.size() - (step - static_cast<uint64_t>(from));
  if (history_[first].step != static_cast<uint64_t>(from) + 1 ||
      history_[first].prev_checksum != req.replica_checksum()) {
    return nullptr;
  }
  const uint32_t c = req.chunk();
  v1::PullResponse header = AnswerHeader(step, stage, phase, c);
  for (size_t i = first + 1; i < history_.size(); ++i) {
    *header.add_later_deltas() = history_[i].delta[c];
  }
  return DeltaAnswer(std::move(header), history_[first].delta[c]);
}

v1::PullResponse ReplicaTracker::AnswerHeader(uint64_t step,
                                              v1::OptimizerStage stage,
                                              uint32_t phase,
                                              uint32_t chunk) const {
  v1::PullResponse header;
  header.set_step(step);
  header.set_stage(stage);
  header.set_schedule_phase(phase);
  header.set_replica_checksum(checksum_);
  header.set_chunk(chunk);
  if (step == skipped_step_) header.set_round_skipped(true);
  return header;
}

PullAnswer ReplicaTracker::DeltaAnswer(v1::PullResponse header,
                                       const v1::EncodedTensor& delta) {
  header.set_kind(v1::PULL_KIND_DELTA);
  v1::EncodedTensor head;
  head.set_codec(delta.codec());
  head.set_num_elements(delta.num_elements());
  *head.mutable_params() = delta.params();
  *head.mutable_segments() = delta.segments();
  return MakePullAnswer(header, head, delta.payload());
}

}  // namespace pserver
