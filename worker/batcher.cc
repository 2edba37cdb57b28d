#include "worker/batcher.h"

#include <algorithm>
#include <cassert>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "worker/rng.h"

namespace pserver {

std::vector<uint32_t> EpochPermutation(uint32_t n, uint64_t seed,
                                       int64_t epoch) {
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  SplitMix64 rng(DeriveSeed(seed, static_cast<uint64_t>(epoch)));
  for (uint32_t i = n; i > 1; --i) {
    const uint32_t j = static_cast<uint32_t>(rng.Uniform(i));
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

absl::StatusOr<Batcher> Batcher::Create(int64_t num_examples, int num_workers,
                                        int worker_id, int batch_size,
                                        uint64_t seed) {
  if (num_workers <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_workers is %d, expected a positive count", num_workers));
  }
  if (worker_id < 0 || worker_id >= num_workers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker_id is %d, expected [0, %d)", worker_id, num_workers));
  }
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "batch_size is %d, expected a positive size", batch_size));
  }
  if (num_examples < 0 || num_examples > int64_t{0xFFFFFFFF}) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_examples is %d, expected [0, 2^32)", num_examples));
  }
  const int64_t global = static_cast<int64_t>(num_workers) * batch_size;
  if (global > num_examples) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "global batch of %d workers x %d = %d exceeds the %d examples",
        num_workers, batch_size, global, num_examples));
  }
  return Batcher(num_examples, num_workers, worker_id, batch_size, seed);
}

Batcher::Batcher(int64_t num_examples, int num_workers, int worker_id,
                 int batch_size, uint64_t seed)
    : num_examples_(num_examples),
      num_workers_(num_workers),
      worker_id_(worker_id),
      batch_size_(batch_size),
      seed_(seed),
      steps_per_epoch_(num_examples /
                       (static_cast<int64_t>(num_workers) * batch_size)) {}

const uint32_t* Batcher::EpochStart(int64_t step) {
  assert(step >= 0);
  const int64_t epoch = step / steps_per_epoch_;
  if (epoch != cached_epoch_) {
    permutation_ =
        EpochPermutation(static_cast<uint32_t>(num_examples_), seed_, epoch);
    cached_epoch_ = epoch;
  }
  return permutation_.data() + (step % steps_per_epoch_) * global_batch_size();
}

absl::Span<const uint32_t> Batcher::WorkerBatch(int64_t step) {
  const uint32_t* global = EpochStart(step);
  return absl::MakeConstSpan(
      global + static_cast<int64_t>(worker_id_) * batch_size_, batch_size_);
}

absl::Span<const uint32_t> Batcher::GlobalBatch(int64_t step) {
  return absl::MakeConstSpan(EpochStart(step), global_batch_size());
}

void GatherBatch(const Dataset& data, absl::Span<const uint32_t> indices,
                 float* x, uint8_t* y) {
  const size_t features = static_cast<size_t>(data.features());
  for (size_t i = 0; i < indices.size(); ++i) {
    assert(indices[i] < data.size);
    const float* src = data.image(indices[i]);
    std::copy(src, src + features, x + i * features);
    y[i] = data.labels[indices[i]];
  }
}

}  // namespace pserver
