// One synchronous round's pushes: validated tensors queued by worker id and
// summed in worker-id order, never arrival order, so a run is bit-
// reproducible whatever the network does. With two consecutive pushes in and
// a large shard, they are decoded at once on two cores; the sum stays
// (acc + d_k) + d_{k+1} element by element, as one at a time (decoding into
// zeros is exact).
//
// Usage (the shard, under its mutex `mu`):
//   round.Queue(w, Round::Push::CopyOf(valid));
//   while (auto batch = round.BeginSum(waits_for)) {
//     RoundSum* sum = round.sum();
//     mu.Unlock(); sum->Add(*batch); mu.Lock();
//     round.EndSum(*batch);
//   }
//   if (round.all_in()) round.WithMean([&](absl::Span<float> mean) { ... });
#ifndef PSERVER_SERVER_ROUND_H_
#define PSERVER_SERVER_ROUND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/validated_tensor.h"
#include "common/thread_pool.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

class RoundSum;

// Thread-safety: thread-compatible; the owner calls every method under its
// own mutex. The sum buffer is a separate, thread-safe RoundSum (sum()), so
// the one thread that got a batch from BeginSum() adds it without the
// owner's mutex while the compiler checks every access to the buffer.
class Round {
 public:
  // A push that passed validation: the shard's copy of its tensor and the
  // token that proves it was checked (common/validated_tensor.h), so
  // summing cannot fail and no decoder is allocated per push.
  struct Push {
    std::unique_ptr<v1::EncodedTensor> tensor;
    std::optional<ValidatedTensor> valid;  // references *tensor

    static Push CopyOf(const ValidatedTensor& v) {
      Push p;
      p.tensor = std::make_unique<v1::EncodedTensor>();
      p.valid = v.CopyInto(p.tensor.get());
      return p;
    }
  };
  // One or two consecutive workers' pushes to sum, from BeginSum().
  struct Batch {
    uint32_t first = 0;
    uint32_t skipped = 0;  // workers before `first` that were not waited for
    const Push* a = nullptr;
    const Push* b = nullptr;  // the next worker's push, or null
  };

  // Sums of at least this many elements decode two pushes at once.
  static constexpr uint64_t kPairedMinElements = uint64_t{1} << 17;

  // `pool` runs the second decode and the chunked loops; it must outlive
  // the round.
  Round(uint32_t num_workers, ThreadPool* pool);

  // Sets the sum's length (a model was installed) and clears the round.
  void Resize(uint64_t n);

  bool queued(uint32_t w) const { return pending_[w].tensor != nullptr; }
  bool summed(uint32_t w) const { return next_ > w; }
  // In this round already (queued or summed).
  bool pushed(uint32_t w) const { return queued(w) || summed(w); }
  uint32_t received() const { return received_; }
  uint32_t contributors() const { return contributors_; }
  // Some push arrived or some worker was passed over.
  bool started() const { return received_ > 0 || next_ > 0; }
  // Every worker was summed or passed over.
  bool all_in() const { return next_ == num_workers_; }
  uint64_t paired_sums() const { return paired_sums_; }
  // A thread holds a batch from BeginSum() and has not called EndSum().
  bool summing() const { return summing_; }

  // REQUIRES: !pushed(w); push.valid holds the sum's length.
  void Queue(uint32_t w, Push push);

  // The next pushes to sum, skipping workers `waits_for` says the round does
  // not wait for; nothing when the next awaited worker has not pushed or
  // another thread is summing.
  std::optional<Batch> BeginSum(absl::FunctionRef<bool(uint32_t)> waits_for);
  // The round's sum buffer; the thread holding a batch adds it there
  // (sum()->Add(batch)) without the owner's mutex.
  RoundSum* sum() { return sum_.get(); }
  // Records the batch as summed; ends the summing thread's turn.
  void EndSum(const Batch& batch);

  // Runs fn on the mean (sum / contributors), which fn may then overwrite
  // (the sum is scratch until Clear()). REQUIRES: all_in(), contributors()>0.
  void WithMean(absl::FunctionRef<void(absl::Span<float>)> fn);
  // Starts the next round: pushes dropped, sum zeroed.
  void Clear();
  // Every worker was passed over (all dropped): wait for one to come back.
  void Restart() { next_ = 0; }

 private:
  const uint32_t num_workers_;
  std::vector<Push> pending_;
  uint32_t received_ = 0;
  uint32_t next_ = 0;  // first worker not yet summed or passed over
  uint32_t contributors_ = 0;
  bool summing_ = false;
  uint64_t paired_sums_ = 0;
  std::unique_ptr<RoundSum> sum_;
};

// The sum of one round's pushes. Thread-safe: every access to the buffer
// holds mu_ (a batch's decode runs under it, on at most two pool threads).
class RoundSum {
 public:
  explicit RoundSum(ThreadPool* pool) : pool_(pool) {}

  // Sets the length and zeroes the sum.
  void Resize(uint64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // Decodes the batch's pushes into the sum. Cannot fail: only validated
  // pushes (tokens) get into a round, so every contributor counted was
  // summed. The batch's pushes must stay alive until it returns.
  void Add(const Round::Batch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Divides by `contributors` (> 0) and runs fn on the mean, which fn may
  // overwrite (the sum is scratch until Zero()).
  void WithMean(uint32_t contributors,
                absl::FunctionRef<void(absl::Span<float>)> fn)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Zero() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ThreadPool* const pool_;
  absl::Mutex mu_;
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);
  std::vector<float> scratch_ ABSL_GUARDED_BY(mu_);  // second decode
};

}  // namespace pserver

#endif  // PSERVER_SERVER_ROUND_H_
