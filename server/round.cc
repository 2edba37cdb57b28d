#include "server/round.h"

#include <algorithm>
#include <utility>

#include "server/optimizer.h"

namespace pserver {

Round::Push Round::Push::CopyOf(const ValidatedTensor& v) {
  auto copy = std::make_shared<v1::EncodedTensor>();
  Push p;
  p.valid = v.CopyInto(copy.get());
  p.owner = std::move(copy);
  return p;
}

Round::Push Round::Push::Own(std::shared_ptr<const v1::PushRequest> request,
                             const ValidatedTensor& v,
                             std::function<void()> on_done) {
  Push p;
  p.valid = v;
  p.owner = std::move(request);
  p.on_done = std::move(on_done);
  return p;
}

Round::Round(uint32_t num_workers, ThreadPool* pool)
    : num_workers_(num_workers),
      queued_(1),
      next_(1, 0),
      count_(1, 0),
      busy_(1, false),
      queued_count_(num_workers, 0),
      contributed_(num_workers, false),
      in_(num_workers, false),
      passed_(num_workers, false),
      sum_(std::make_unique<RoundSum>(pool)) {}

std::vector<std::function<void()>> Round::Resize(uint64_t n,
                                                 uint64_t chunk_elements) {
  std::vector<std::function<void()>> dropped = Clear();
  plan_.n = n;
  plan_.chunk_elements = chunk_elements;
  num_chunks_ = plan_.num_chunks();
  queued_.assign(num_chunks_, {});
  next_.assign(num_chunks_, 0);
  count_.assign(num_chunks_, 0);
  busy_.assign(num_chunks_, false);
  chunks_done_ = 0;
  sum_->Resize(plan_);
  return dropped;
}

bool Round::started() const {
  if (received_ > 0) return true;
  for (uint32_t n : next_) {
    if (n > 0) return true;
  }
  return false;
}

void Round::Queue(uint32_t w, Push push, uint32_t c) {
  queued_[c].emplace(w, std::move(push));
  ++queued_count_[w];
  ++received_;
  if (!in_[w]) {
    in_[w] = true;
    ++workers_in_;
  }
}

void Round::Skip(uint32_t c, absl::FunctionRef<bool(uint32_t)> waits_for) {
  if (next_[c] == num_workers_ || busy_[c]) return;
  while (next_[c] < num_workers_ && !queued(next_[c], c) &&
         !waits_for(next_[c])) {
    passed_[next_[c]] = true;
    ++next_[c];  // passed over
  }
  if (next_[c] == num_workers_) ++chunks_done_;
}

std::optional<Round::Batch> Round::BeginSum(
    absl::FunctionRef<bool(uint32_t)> waits_for) {
  for (uint32_t c = 0; c < num_chunks_; ++c) {
    if (busy_[c] || next_[c] == num_workers_) continue;
    const uint32_t before = next_[c];
    Skip(c, waits_for);
    if (next_[c] == num_workers_ || !queued(next_[c], c)) continue;
    Batch batch;
    batch.chunk = c;
    batch.first = next_[c];
    batch.skipped = next_[c] - before;
    batch.assign = count_[c] == 0;
    batch.a = &queued_[c].at(next_[c]);
    busy_[c] = true;
    ++busy_count_;
    return batch;
  }
  return std::nullopt;
}

std::function<void()> Round::EndSum(const Batch& batch) {
  const uint32_t c = batch.chunk;
  const uint32_t w = batch.first;
  auto it = queued_[c].find(w);
  std::function<void()> done = std::move(it->second.on_done);
  queued_[c].erase(it);
  --queued_count_[w];
  ++count_[c];
  if (!contributed_[w]) {
    contributed_[w] = true;
    ++contributors_;
  }
  next_[c] = w + 1;
  busy_[c] = false;
  --busy_count_;
  if (next_[c] == num_workers_) ++chunks_done_;
  return done;
}

void Round::WithMean(
    absl::FunctionRef<void(absl::Span<float>)> fn,
    absl::Span<const std::pair<uint64_t, uint64_t>> keep_sum) {
  sum_->WithMean(count_, fn, keep_sum);
}

double Round::MeanSquaredNorm(
    absl::Span<const std::pair<uint64_t, uint64_t>> ranges) const {
  return sum_->SquaredNormOfMean(count_, ranges);
}

std::vector<std::function<void()>> Round::Clear() {
  std::vector<std::function<void()>> dropped;
  for (auto& chunk : queued_) {
    for (auto& [w, push] : chunk) {
      if (push.on_done) dropped.push_back(std::move(push.on_done));
    }
    chunk.clear();
  }
  std::fill(next_.begin(), next_.end(), 0);
  std::fill(count_.begin(), count_.end(), 0);
  std::fill(busy_.begin(), busy_.end(), false);
  std::fill(queued_count_.begin(), queued_count_.end(), 0);
  std::fill(contributed_.begin(), contributed_.end(), false);
  std::fill(in_.begin(), in_.end(), false);
  std::fill(passed_.begin(), passed_.end(), false);
  received_ = 0;
  workers_in_ = 0;
  contributors_ = 0;
  chunks_done_ = 0;
  busy_count_ = 0;
  return dropped;
}

void Round::Restart() {
  std::fill(next_.begin(), next_.end(), 0);
  std::fill(passed_.begin(), passed_.end(), false);
  chunks_done_ = 0;
}

void RoundSum::Resize(const ChunkPlan& plan) {
  absl::MutexLock l(&mu_);
  plan_ = plan;
  sum_.assign(plan.n, 0.0f);
}

void RoundSum::Add(const Round::Batch& batch) {
  absl::ReaderMutexLock l(&mu_);
  // Round gives chunk c to one thread at a time: the ranges written under
  // the shared lock never overlap.
  float* base = const_cast<float*>(sum_.data());
  absl::Span<float> chunk(base + plan_.begin(batch.chunk),
                          plan_.size(batch.chunk));
  if (batch.assign) {
    batch.a->valid->AssignInto(batch.a->weight, chunk);
  } else {
    batch.a->valid->AccumulateInto(batch.a->weight, chunk);
  }
}

void RoundSum::WithMean(
    const std::vector<uint32_t>& counts,
    absl::FunctionRef<void(absl::Span<float>)> fn,
    absl::Span<const std::pair<uint64_t, uint64_t>> keep_sum) {
  absl::MutexLock l(&mu_);
  float* acc = sum_.data();
  // A chunk no push wrote holds the last round's scratch: its mean is zero.
  for (uint32_t c = 0; c < counts.size(); ++c) {
    if (counts[c] == 0) {
      std::fill_n(acc + plan_.begin(c), plan_.size(c), 0.0f);
    }
  }
  std::vector<float> kept;  // small: broadcast buffers only
  for (const auto& [b, e] : keep_sum) {
    kept.insert(kept.end(), acc + b, acc + std::min<uint64_t>(e, sum_.size()));
  }
  for (uint32_t c = 0; c < counts.size(); ++c) {
    // One push: the sum is the mean (x * 1 is x), no pass over the chunk;
    // none: zeroed above.
    if (counts[c] <= 1) continue;
    const float inv = 1.0f / static_cast<float>(counts[c]);
    float* chunk = acc + plan_.begin(c);
    pool_->ParallelFor(plan_.size(c), kMinParallelChunk,
                       [chunk, inv](uint64_t b, uint64_t e) {
                         for (uint64_t i = b; i < e; ++i) chunk[i] *= inv;
                       });
  }
  size_t at = 0;
  for (const auto& [b, e] : keep_sum) {
    const uint64_t end = std::min<uint64_t>(e, sum_.size());
    std::copy(kept.begin() + at, kept.begin() + at + (end - b), acc + b);
    at += end - b;
  }
  fn(absl::MakeSpan(sum_));
}

double RoundSum::SquaredNormOfMean(
    const std::vector<uint32_t>& counts,
    absl::Span<const std::pair<uint64_t, uint64_t>> ranges) {
  absl::MutexLock l(&mu_);
  double sq = 0;
  for (uint32_t c = 0; c < counts.size(); ++c) {
    if (counts[c] == 0) continue;  // its mean is zero
    // WithMean's values: sum * (1 / count), and x * 1.0f is x.
    const float inv = 1.0f / static_cast<float>(counts[c]);
    const uint64_t cb = plan_.begin(c), ce = cb + plan_.size(c);
    for (const auto& [b, e] : ranges) {
      for (uint64_t i = std::max(b, cb); i < std::min(e, ce); ++i) {
        const float m = sum_[i] * inv;
        sq += static_cast<double>(m) * m;
      }
    }
  }
  return sq;
}

}  // namespace pserver
