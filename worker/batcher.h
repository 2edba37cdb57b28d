// Which training examples each worker uses at each step. Every epoch has a
// seeded global permutation of the training set; global batch g of the epoch
// covers permutation positions [g*W*b, (g+1)*W*b) and worker w takes
// [g*W*b + w*b, g*W*b + (w+1)*b). So W workers of batch b together see
// exactly one global batch of W*b, the same one a single process with batch
// W*b would see. Steps per epoch = floor(N / (W*b)); the remainder of the
// permutation is dropped for that epoch.
//
//   absl::StatusOr<Batcher> batcher = Batcher::Create(60000, 4, 1, 32, seed);
//   absl::Span<const uint32_t> idx = batcher->WorkerBatch(step);
//   GatherBatch(train, idx, x.data(), y.data());
#ifndef PSERVER_WORKER_BATCHER_H_
#define PSERVER_WORKER_BATCHER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/dataset.h"

namespace pserver {

// The permutation of [0, n) used in `epoch`: a Fisher-Yates shuffle driven by
// SplitMix64 seeded with DeriveSeed(seed, epoch). Deterministic given
// (n, seed, epoch).
std::vector<uint32_t> EpochPermutation(uint32_t n, uint64_t seed,
                                       int64_t epoch);

// Thread-compatible: WorkerBatch caches the current epoch's permutation, so
// concurrent calls need external locking.
class Batcher {
 public:
  // INVALID_ARGUMENT unless num_workers > 0, 0 <= worker_id < num_workers,
  // batch_size > 0, num_examples < 2^32 and at least one global batch of
  // num_workers * batch_size fits in num_examples.
  static absl::StatusOr<Batcher> Create(int64_t num_examples, int num_workers,
                                        int worker_id, int batch_size,
                                        uint64_t seed);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int batch_size() const { return batch_size_; }
  int64_t global_batch_size() const {
    return static_cast<int64_t>(num_workers_) * batch_size_;
  }

  // Example indices of this worker's slice at `step`, counted from 0 over
  // all epochs (epoch = step / steps_per_epoch()). The span stays valid until
  // the next call that moves to another epoch. REQUIRES: step >= 0.
  absl::Span<const uint32_t> WorkerBatch(int64_t step);

  // The whole global batch at `step` (all workers' slices in worker order).
  absl::Span<const uint32_t> GlobalBatch(int64_t step);

 private:
  Batcher(int64_t num_examples, int num_workers, int worker_id, int batch_size,
          uint64_t seed);
  const uint32_t* EpochStart(int64_t step);

  int64_t num_examples_;
  int num_workers_;
  int worker_id_;
  int batch_size_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  int64_t cached_epoch_ = -1;
  std::vector<uint32_t> permutation_;
};

// Copies the examples `indices` of `data` into x (rows of data.features()
// floats) and y. REQUIRES: every index < data.size; x and y have room.
void GatherBatch(const Dataset& data, absl::Span<const uint32_t> indices,
                 float* x, uint8_t* y);

}  // namespace pserver

#endif  // PSERVER_WORKER_BATCHER_H_
