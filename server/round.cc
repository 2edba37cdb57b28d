#include "server/round.h"

#include <algorithm>
#include <utility>

#include "server/optimizer.h"

namespace pserver {

Round::Round(uint32_t num_workers, ThreadPool* pool)
    : num_workers_(num_workers),
      pending_(num_workers),
      sum_(std::make_unique<RoundSum>(pool)) {}

void Round::Resize(uint64_t n) {
  sum_->Resize(n);
  Clear();
}

void Round::Queue(uint32_t w, Push push) {
  pending_[w] = std::move(push);
  ++received_;
}

std::optional<Round::Batch> Round::BeginSum(
    absl::FunctionRef<bool(uint32_t)> waits_for) {
  if (summing_) return std::nullopt;
  Batch batch;
  while (next_ < num_workers_ && !queued(next_)) {
    if (waits_for(next_)) return std::nullopt;  // the round waits for it
    ++next_;                                    // passed over
    ++batch.skipped;
  }
  if (next_ == num_workers_) return std::nullopt;
  batch.first = next_;
  batch.a = &pending_[next_];
  if (next_ + 1 < num_workers_ && queued(next_ + 1) &&
      batch.a->tensor->num_elements() >= kPairedMinElements) {
    batch.b = &pending_[next_ + 1];
  }
  summing_ = true;
  return batch;
}

void Round::EndSum(const Batch& batch) {
  const uint32_t n = batch.b != nullptr ? 2 : 1;
  next_ = batch.first + n;
  contributors_ += n;
  if (n == 2) ++paired_sums_;
  summing_ = false;
}

void Round::WithMean(absl::FunctionRef<void(absl::Span<float>)> fn) {
  sum_->WithMean(contributors_, fn);
}

void Round::Clear() {
  sum_->Zero();
  for (Push& p : pending_) p = Push();
  received_ = 0;
  next_ = 0;
  contributors_ = 0;
  summing_ = false;
}

void RoundSum::Resize(uint64_t n) {
  absl::MutexLock l(&mu_);
  sum_.assign(n, 0.0f);
  scratch_.clear();
  scratch_.shrink_to_fit();
}

void RoundSum::Add(const Round::Batch& batch) {
  absl::MutexLock l(&mu_);
  const absl::Span<float> sum = absl::MakeSpan(sum_);
  if (batch.b == nullptr) {
    batch.a->valid->AccumulateInto(1.0f, sum);
    return;
  }
  scratch_.resize(sum_.size());
  const absl::Span<float> scratch = absl::MakeSpan(scratch_);
  pool_->RunBoth([&] { batch.a->valid->AccumulateInto(1.0f, sum); },
                 [&] { batch.b->valid->DecodeInto(scratch); });
  float* acc = sum.data();
  const float* add = scratch.data();
  pool_->ParallelFor(sum.size(), kMinParallelChunk,
                     [acc, add](uint64_t b, uint64_t e) {
                       for (uint64_t i = b; i < e; ++i) acc[i] += add[i];
                     });
}

void RoundSum::WithMean(uint32_t contributors,
                        absl::FunctionRef<void(absl::Span<float>)> fn) {
  absl::MutexLock l(&mu_);
  const float inv = 1.0f / static_cast<float>(contributors);
  float* acc = sum_.data();
  pool_->ParallelFor(sum_.size(), kMinParallelChunk,
                     [acc, inv](uint64_t b, uint64_t e) {
                       for (uint64_t i = b; i < e; ++i) acc[i] *= inv;
                     });
  fn(absl::MakeSpan(sum_));
}

void RoundSum::Zero() {
  absl::MutexLock l(&mu_);
  std::fill(sum_.begin(), sum_.end(), 0.0f);
}

}  // namespace pserver
