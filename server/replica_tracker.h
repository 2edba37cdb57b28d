// The downlink's replica tracking: x_hat, the weights every worker holds,
// follows the shard's weights x through the pull codec; each round the
// shard encodes d = encode(x - x_hat), adds decode(d) to x_hat and serves d
// as the pull delta (the residual x - x_hat is the downlink's error
// feedback). A worker whose replica is not x_hat(step - 1), by step or by
// checksum, gets a full fp32 snapshot instead. Both are cut into the
// slice's chunks (common/chunking.h): each chunk is encoded on its own and
// answered, serialized once, to every pull of that chunk.
#ifndef PSERVER_SERVER_REPLICA_TRACKER_H_
#define PSERVER_SERVER_REPLICA_TRACKER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/chunking.h"
#include "common/codec.h"
#include "common/tensor_codecs.h"
#include "common/thread_pool.h"
#include "common/unchanged.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/pull_waiters.h"

namespace pserver {

// Thread-compatible: the shard calls it under its mutex.
class ReplicaTracker {
 public:
  // INVALID_ARGUMENT for a pull codec or parameters MakeCodec refuses.
  static absl::StatusOr<std::unique_ptr<ReplicaTracker>> Create(
      uint32_t shard_index, v1::Codec pull_codec,
      const v1::CodecParams& pull_params, ThreadPool* pool);

  // Starts from the weights themselves: x_hat = x, no delta; pulls are
  // answered in chunks of `chunk_elements`. With the fp32 pull codec x_hat
  // is x itself: the tracker keeps a view of `x` (which must then stay
  // allocated, at the same address, while the tracker is used: the shard's
  // weights are updated in place) instead of a copy.
  void Reset(absl::Span<const float> x,
             uint64_t chunk_elements = kDefaultChunkElements);
  // From a checkpoint, after Reset. REQUIRES: the checksum was verified by
  // the loader. A delta whose chunks do not match this shard's chunking
  // (another --chunk_elements) is dropped: pulls get snapshots.
  void Restore(std::vector<float> x_hat, std::vector<v1::EncodedTensor> delta,
               uint64_t checksum, uint64_t prev_checksum);
  // After the optimizer's step to `step`: x_hat follows x through the pull
  // codec. `scratch` (x's length) is overwritten. Returns ||x - x_hat||.
  double Advance(absl::Span<const float> x, uint64_t step,
                 absl::Span<float> scratch);
  // The same without computing ||x - x_hat|| (a pass over the slice);
  // returns 0.
  void AdvanceQuietly(absl::Span<const float> x, uint64_t step,
                      absl::Span<float> scratch) {
    Advance(x, step, scratch, /*norm=*/false);
  }
  // Pulls of `step` say that round step - 1 updated nothing
  // (PullResponse.round_skipped): a worker reported an overflow.
  void MarkRoundSkipped(uint64_t step) { skipped_step_ = step; }
  // The workers' replicas are not x_hat any more (the shard skipped rounds):
  // pulls get snapshots until the next Advance.
  void Invalidate();
  // Keeps the deltas of the last `steps` rounds (0: none, the default) while
  // together they are smaller than a snapshot of the slice, so a worker up
  // to that many steps behind is answered with them in a row
  // (PullResponse.later_deltas) instead of a snapshot. For ssp and async,
  // where workers skip steps.
  void KeepHistory(uint32_t steps) {
    history_limit_ = steps;
    TrimHistory();
  }

  // The codec the next Advance encodes with: a compression schedule's
  // phase's (common/schedule.h), or nullptr for the configured one; the
  // residual x - x_hat carries over. REQUIRES: `codec` is fp32 exactly when
  // the configured codec is (with fp32, x_hat is x itself; the shard's
  // config check refuses schedules that would mix them), and it outlives
  // its use here.
  void UseCodec(const Codec* codec) {
    active_ = codec != nullptr ? codec : codec_.get();
  }
  // A schedule phase's per-tensor pull codecs over the slice (tensors
  // without one keep the active codec); CodecPlan() for none. A chunk
  // holding tensors of different codecs is served as CODEC_SEGMENTS.
  void UseTensorCodecs(CodecPlan plan) { tensor_plan_ = std::move(plan); }
  // The slice's buffer tensors (common/unchanged.h BufferRanges): a delta's
  // buffer piece that is all zeros (the buffer did not change) is served as
  // CODEC_UNCHANGED, i.e. as nothing.
  void UseBufferRanges(ElementRanges buffers) { buffers_ = std::move(buffers); }

  // The answer to a pull of chunk req.chunk() of the current step `step` in
  // stage `stage`: nothing (PULL_KIND_CURRENT) when the request proves the
  // worker holds x_hat(step), the delta when it proves x_hat(step - 1), else
  // a snapshot. `phase` is the compression schedule's
  // phase of round `step` (a function of the step). Answers are built once
  // per step and chunk and shared. REQUIRES: req.chunk() <
  // plan().num_chunks().
  PullAnswer Answer(const v1::PullRequest& req, uint64_t step,
                    v1::OptimizerStage stage, uint32_t phase = 0);

  absl::Span<const float> x_hat() const { return hat_; }
  // The delta's chunks (empty: none).
  const std::vector<v1::EncodedTensor>& delta() const { return delta_; }
  const ChunkPlan& plan() const { return plan_; }
  uint64_t checksum() const { return checksum_; }
  uint64_t prev_checksum() const { return prev_checksum_; }

 private:
  ReplicaTracker(uint32_t shard_index, v1::Codec pull_codec,
                 std::unique_ptr<Codec> codec, ThreadPool* pool);
  void DropAnswers();
  void TrimHistory();
  // A pull answer's fields but its kind and weights (the current checksum).
  v1::PullResponse AnswerHeader(uint64_t step, v1::OptimizerStage stage,
                                uint32_t phase, uint32_t chunk) const;
  // `header` as a DELTA answer whose weights are `delta`.
  static PullAnswer DeltaAnswer(v1::PullResponse header,
                                const v1::EncodedTensor& delta);
  // The answer to chunk c of a worker holding x_hat(from) (history), or
  // null when the history does not reach back to it.
  PullAnswer AnswerFromHistory(const v1::PullRequest& req, uint64_t step,
                               v1::OptimizerStage stage, uint32_t phase);
  double Advance(absl::Span<const float> x, uint64_t step,
                 absl::Span<float> scratch, bool norm);

  const uint32_t shard_index_;
  const v1::Codec pull_codec_id_;
  const std::unique_ptr<Codec> codec_;  // the configured pull codec
  const Codec* active_;                 // codec_, or a schedule's
  CodecPlan tensor_plan_;               // per-tensor codecs (uniform: none)
  ElementRanges buffers_;               // UseBufferRanges
  ThreadPool* const pool_;
  ChunkPlan plan_;
  std::vector<float> x_hat_;    // unused with the fp32 pull codec
  absl::Span<const float> hat_;  // x_hat_, or the shard's x (fp32)
  // The delta that takes x_hat(step - 1) to x_hat(step), chunk by chunk, if
  // there is one.
  std::vector<v1::EncodedTensor> delta_;
  uint64_t prev_checksum_ = 0;
  uint64_t checksum_ = 0;
  uint64_t skipped_step_ = 0;  // MarkRoundSkipped's (0: none)
  // Answers of the current step, shared by every pull that gets them.
  std::vector<PullAnswer> delta_answers_;  // per chunk, built on demand
  // Snapshots are fp32 (as large as the slice): kept only while some pull
  // holds them (waiting or on the wire), so they are shared by the pulls in
  // flight together but cost no memory between pulls.
  std::vector<std::weak_ptr<const PullChunk>> snapshot_answers_;
  // Recent rounds' deltas, oldest first (KeepHistory): the delta that
  // took x_hat(step - 1), whose checksum is prev_checksum, to x_hat(step).
  struct Past {
    uint64_t step = 0;
    uint64_t prev_checksum = 0;
    std::vector<v1::EncodedTensor> delta;
    uint64_t bytes = 0;
  };
  std::deque<Past> history_;
  uint32_t history_limit_ = 0;
  uint64_t history_bytes_ = 0;
  uint64_t answers_step_ = 0;
  v1::OptimizerStage answers_stage_ = v1::OPTIMIZER_STAGE_UNSPECIFIED;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_REPLICA_TRACKER_H_
