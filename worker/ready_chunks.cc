#include "worker/ready_chunks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {

void ReadyChunks::Reset(uint64_t total, const std::vector<ShardRange>& ranges,
                        const std::vector<ChunkPlan>& plans) {
  absl::MutexLock l(&mu_);
  total_ = total;
  ranges_ = ranges;
  plans_ = plans;
  marked_.clear();
  missing_.assign(ranges.size(), {});
  ready_.assign(ranges.size(), {});
  for (size_t s = 0; s < ranges.size(); ++s) {
    const ChunkPlan& p = plans[s];
    for (uint32_t c = 0; c < p.num_chunks(); ++c) {
      missing_[s].push_back(p.size(c));
      if (p.size(c) == 0) ready_[s].push_back(c);  // an empty slice
    }
  }
}

absl::Status ReadyChunks::Mark(uint64_t begin, uint64_t end) {
  absl::MutexLock l(&mu_);
  if (begin >= end || end > total_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient range [", begin, ", ", end, ") is empty or outside the ",
        total_, " parameters"));
  }
  // The first range that ends after `begin` must start at or after `end`.
  auto next = marked_.upper_bound(begin);
  if (next != marked_.begin()) {
    auto prev = std::prev(next);
    if (prev->second > begin) next = prev;
  }
  if (next != marked_.end() && next->first < end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient range [", begin, ", ", end, ") overlaps [", next->first,
        ", ", next->second, ") handed over before in this step"));
  }
  marked_.emplace(begin, end);
  for (size_t s = 0; s < ranges_.size(); ++s) {
    const uint64_t b = std::max(begin, ranges_[s].begin);
    const uint64_t e = std::min(end, ranges_[s].end);
    if (b >= e) continue;
    const ChunkPlan& p = plans_[s];
    const uint64_t lo = b - ranges_[s].begin, hi = e - ranges_[s].begin;
    for (uint32_t c = static_cast<uint32_t>(lo / p.chunk_elements);
         c < p.num_chunks() && p.begin(c) < hi; ++c) {
      const uint64_t overlap = std::min(hi, p.end(c)) - std::max(lo, p.begin(c));
      missing_[s][c] -= overlap;
      if (missing_[s][c] == 0) ready_[s].push_back(c);
    }
  }
  return absl::OkStatus();
}

std::vector<std::pair<uint64_t, uint64_t>> ReadyChunks::Missing() const {
  absl::MutexLock l(&mu_);
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t at = 0;
  for (const auto& [b, e] : marked_) {
    if (b > at) out.emplace_back(at, b);
    at = e;
  }
  if (at < total_) out.emplace_back(at, total_);
  return out;
}

int64_t ReadyChunks::Take(size_t s) {
  absl::MutexLock l(&mu_);
  if (ready_[s].empty()) return -1;
  const uint32_t c = ready_[s].front();
  ready_[s].pop_front();
  return c;
}

}  // namespace pserver
