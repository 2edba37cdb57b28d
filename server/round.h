// One synchronous round's pushes: validated tensors queued by worker id and
// summed in worker-id order, never arrival order, so a run is bit-
// reproducible whatever the network does. With two consecutive pushes in and
// a large shard, they are decoded at once on two cores; the sum stays
// (acc + d_k) + d_{k+1} element by element, as one at a time (decoding into
// zeros is exact).
//
// Usage (the shard, under its mutex `mu`):
//   round.Queue(w, Round::Push::CopyOf(validated));
//   while (auto batch = round.BeginSum(waits_for)) {
//     mu.Unlock(); round.Sum(*batch); mu.Lock();
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

// Thread-safety: every method but Sum() is called under the owner's mutex
// (thread-compatible); Sum() runs without it, on the one thread that got its
// batch from BeginSum(), and the sum buffer has a mutex of its own so the
// compiler checks who touches it.
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
  void Resize(uint64_t n) ABSL_LOCKS_EXCLUDED(sum_mu_);

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
  // Decodes the batch into the sum. Called without the owner's mutex.
  // Cannot fail: only validated pushes (tokens) get into the round, so every
  // contributor counted was summed.
  void Sum(const Batch& batch) ABSL_LOCKS_EXCLUDED(sum_mu_);
  // Records the batch as summed; ends the summing thread's turn.
  void EndSum(const Batch& batch);

  // Runs fn on the mean (sum / contributors), which fn may then overwrite
  // (the sum is scratch until Clear()). REQUIRES: all_in(), contributors()>0.
  void WithMean(absl::FunctionRef<void(absl::Span<float>)> fn)
      ABSL_LOCKS_EXCLUDED(sum_mu_);
  // Starts the next round: pushes dropped, sum zeroed.
  void Clear() ABSL_LOCKS_EXCLUDED(sum_mu_);
  // Every worker was passed over (all dropped): wait for one to come back.
  void Restart() { next_ = 0; }

 private:
  const uint32_t num_workers_;
  ThreadPool* const pool_;
  std::vector<Push> pending_;
  uint32_t received_ = 0;
  uint32_t next_ = 0;  // first worker not yet summed or passed over
  uint32_t contributors_ = 0;
  bool summing_ = false;
  uint64_t paired_sums_ = 0;

  absl::Mutex sum_mu_;
  std::vector<float> sum_ ABSL_GUARDED_BY(sum_mu_);
  std::vector<float> scratch_ ABSL_GUARDED_BY(sum_mu_);  // second decode
};

}  // namespace pserver

#endif  // PSERVER_SERVER_ROUND_H_
