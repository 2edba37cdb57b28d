// One synchronous round's pushes, chunk by chunk: validated chunk pushes are
// queued by (worker, chunk) and each chunk is summed in worker-id order,
// never arrival order, so a run is bit-reproducible whatever the network
// does. Different chunks are summed at once by different threads (the
// threads that delivered them), so a round's decode work spreads over the
// cores while later chunks are still on the wire.
//
// Usage (the shard, under its mutex `mu`):
//   round.Queue(w, Round::Push::Own(std::move(request), valid, on_summed), c);
//   while (auto batch = round.BeginSum(waits_for)) {
//     RoundSum* sum = round.sum();
//     mu.Unlock(); sum->Add(*batch); mu.Lock();
//     done.push_back(round.EndSum(*batch));   // run after unlocking
//   }
//   if (round.all_in()) round.WithMean([&](absl::Span<float> mean) { ... });
#ifndef PSERVER_SERVER_ROUND_H_
#define PSERVER_SERVER_ROUND_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/chunking.h"
#include "common/thread_pool.h"
#include "common/validated_tensor.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

class RoundSum;

// Thread-safety: thread-compatible; the owner calls every method under its
// own mutex. The sum buffer is a separate, thread-safe RoundSum (sum()), so
// the threads that got batches from BeginSum() (at most one per chunk) add
// them without the owner's mutex.
class Round {
 public:
  // A chunk push that passed validation: what owns its bytes, the token
  // that proves it was checked (common/validated_tensor.h), so summing
  // cannot fail and no decoder is allocated per push, and what to run once
  // it was summed or dropped (the transport acknowledges the chunk then).
  struct Push {
    std::shared_ptr<const void> owner;
    std::optional<ValidatedTensor> valid;  // references memory `owner` keeps
    std::function<void()> on_done;         // may be empty
    // Its weight in the round's mean (server/round_policy.h: 1 unless
    // stale pushes are scaled down).
    float weight = 1.0f;
    // PushRequest.overflow: the round it is summed into updates nothing.
    bool overflow = false;

    // A copy of the validated tensor (tests, and callers that do not own
    // their request).
    static Push CopyOf(const ValidatedTensor& v);
    // Keeps `request` (whose gradient `v` was made from) instead of copying.
    static Push Own(std::shared_ptr<const v1::PushRequest> request,
                    const ValidatedTensor& v, std::function<void()> on_done);
  };
  // One worker's push of one chunk to sum, from BeginSum().
  struct Batch {
    uint32_t chunk = 0;
    uint32_t first = 0;    // the worker
    uint32_t skipped = 0;  // workers before it passed over in this chunk
    // The chunk's first push this round: its decode overwrites the chunk
    // (which holds the last round's scratch) instead of adding to it.
    bool assign = false;
    const Push* a = nullptr;
  };

  // `pool` runs the chunked loops of the mean; it must outlive the round.
  Round(uint32_t num_workers, ThreadPool* pool);

  // Sets the sum's length and chunking (a model was installed) and clears
  // the round. The on_done of dropped pushes are returned to be run.
  std::vector<std::function<void()>> Resize(
      uint64_t n, uint64_t chunk_elements = kDefaultChunkElements);
  const ChunkPlan& plan() const { return plan_; }
  uint32_t num_chunks() const { return num_chunks_; }

  bool queued(uint32_t w, uint32_t c = 0) const {
    return queued_[c].count(w) != 0;
  }
  bool summed(uint32_t w, uint32_t c = 0) const { return next_[c] > w; }
  // Chunk c of worker w is in this round already (queued or summed).
  bool pushed(uint32_t w, uint32_t c = 0) const {
    return queued(w, c) || summed(w, c);
  }
  // Some chunk of worker w is queued.
  bool queued_any(uint32_t w) const { return queued_count_[w] > 0; }
  // Some chunk of worker w was received this round (queued or summed).
  bool pushed_any(uint32_t w) const { return in_[w]; }
  // Some chunk passed worker w over this round (it had not pushed it and
  // the round did not wait): its push belongs to a later round.
  bool passed_over(uint32_t w) const { return passed_[w]; }
  // Chunk pushes received this round.
  uint32_t received() const { return received_; }
  // Workers with at least one chunk received this round.
  uint32_t workers_in() const { return workers_in_; }
  // Workers with at least one chunk summed this round.
  uint32_t contributors() const { return contributors_; }
  // Some push arrived or some worker was passed over.
  bool started() const;
  // Every chunk has every worker summed or passed over.
  bool all_in() const { return chunks_done_ == num_chunks_; }
  // Some thread holds a batch from BeginSum() and has not called EndSum().
  bool summing() const { return busy_count_ > 0; }

  // REQUIRES: !pushed(w, c); push.valid holds chunk c's length.
  void Queue(uint32_t w, Push push, uint32_t c = 0);

  // The next chunk push to sum (a chunk no other thread is summing, whose
  // next worker in id order has pushed it), skipping workers `waits_for`
  // says the round does not wait for; nothing when no chunk is ready.
  std::optional<Batch> BeginSum(absl::FunctionRef<bool(uint32_t)> waits_for);
  RoundSum* sum() { return sum_.get(); }
  // Records the batch as summed; returns the push's on_done (to be run
  // without the owner's mutex).
  std::function<void()> EndSum(const Batch& batch);

  // Runs fn on the mean (each chunk's sum / its contributors; a chunk no
  // worker contributed to is zero), which fn may then overwrite (scratch:
  // the next round's first pushes write over it). REQUIRES: all_in(),
  // contributors() > 0.
  // Elements in `keep_sum` (sorted, disjoint [begin, end) ranges) stay the
  // sum (broadcast buffers: one worker pushes, the rest push zeros).
  void WithMean(
      absl::FunctionRef<void(absl::Span<float>)> fn,
      absl::Span<const std::pair<uint64_t, uint64_t>> keep_sum = {});
  // The squared L2 norm of the mean over `ranges` (sorted, disjoint), in
  // double, without changing the sum (WithMean's values, read).
  // REQUIRES: all_in().
  double MeanSquaredNorm(
      absl::Span<const std::pair<uint64_t, uint64_t>> ranges) const;
  // Starts the next round: pushes dropped, sum zeroed. Returns the on_done
  // of pushes dropped unsummed.
  std::vector<std::function<void()>> Clear();
  // Every worker was passed over (all dropped): wait for one to come back.
  void Restart();

 private:
  // Moves chunk c past workers not waited for; counts it done at the end.
  void Skip(uint32_t c, absl::FunctionRef<bool(uint32_t)> waits_for);

  const uint32_t num_workers_;
  ChunkPlan plan_;
  uint32_t num_chunks_ = 1;
  // Per chunk: queued pushes by worker, the first worker not yet summed or
  // passed over, the workers summed, and whether a thread is summing it.
  std::vector<std::map<uint32_t, Push>> queued_;
  std::vector<uint32_t> next_;
  std::vector<uint32_t> count_;
  std::vector<bool> busy_;
  std::vector<uint32_t> queued_count_;      // per worker
  std::vector<bool> contributed_;           // per worker
  std::vector<bool> in_;                    // per worker: some chunk came
  std::vector<bool> passed_;                // per worker: some chunk skipped it
  uint32_t received_ = 0;
  uint32_t workers_in_ = 0;
  uint32_t contributors_ = 0;
  uint32_t chunks_done_ = 0;
  uint32_t busy_count_ = 0;
  std::unique_ptr<RoundSum> sum_;
};

// The sum of one round's pushes. Thread-safe: the layout (length, buffer)
// changes only under the writer lock; adds hold it shared and write the
// chunk's range only, which Round hands to one thread at a time.
class RoundSum {
 public:
  explicit RoundSum(ThreadPool* pool) : pool_(pool) {}

  // Sets the length and chunking and zeroes the sum.
  void Resize(const ChunkPlan& plan) ABSL_LOCKS_EXCLUDED(mu_);
  // Decodes the batch's push into its chunk of the sum: written over the
  // chunk when batch.assign (0 + w x decode, bit for bit an add to a zeroed
  // chunk), added to it otherwise. A chunk is not zeroed between rounds:
  // its first push's decode writes it, so nothing is read or written twice.
  // Cannot fail: only validated pushes (tokens) get into a round. The push
  // must stay alive until it returns.
  void Add(const Round::Batch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Zeroes each chunk c with counts[c] == 0 (no push wrote it this round),
  // divides chunk c by counts[c] > 1, except the elements of `keep_sum`, and
  // runs fn on the result, which fn may overwrite (the sum is scratch until
  // the next round's first pushes).
  void WithMean(const std::vector<uint32_t>& counts,
                absl::FunctionRef<void(absl::Span<float>)> fn,
                absl::Span<const std::pair<uint64_t, uint64_t>> keep_sum = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  double SquaredNormOfMean(
      const std::vector<uint32_t>& counts,
      absl::Span<const std::pair<uint64_t, uint64_t>> ranges)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ThreadPool* const pool_;
  absl::Mutex mu_;
  ChunkPlan plan_ ABSL_GUARDED_BY(mu_);
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_SERVER_ROUND_H_
