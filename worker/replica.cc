#include "worker/replica.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/validated_tensor.h"

namespace pserver {

void Replica::Reset(uint64_t total, std::vector<ShardRange> ranges,
                    uint64_t step) {
  ranges_ = std::move(ranges);
  weights_.assign(total, 0.0f);
  staging_.assign(total, 0.0f);
  checksums_.assign(ranges_.size(), 0);
  staged_checksums_.assign(ranges_.size(), 0);
  staged_.assign(ranges_.size(), false);
  hashing_.assign(ranges_.size(), Hashing());
  steps_.assign(ranges_.size(), step);
  step_ = step;
}

void Replica::BeginUpdate() {
  std::fill(staged_.begin(), staged_.end(), false);
  hashing_.assign(ranges_.size(), Hashing());
}

void Replica::HashStaged(size_t s, uint64_t offset, uint64_t size) {
  Hashing& hs = hashing_[s];
  // Chunk 0 after a hashed prefix: the answer starts again (a new attempt).
  // Before any (chunks may arrive out of order), what waits is kept.
  if (offset == 0 && (hs.to > 0 || hs.stale)) hs = Hashing();
  if (offset < hs.to) {
    hs.stale = true;
    return;
  }
  const float* base = staging_.data() + ranges_[s].begin;
  if (offset != hs.to) {
    hs.waiting[offset] = size;  // early: waits for the chunks before it
    return;
  }
  hs.h.Update(base + offset, size * sizeof(float));
  hs.to += size;
  for (auto it = hs.waiting.begin();
       it != hs.waiting.end() && it->first == hs.to;
       it = hs.waiting.erase(it)) {
    hs.h.Update(base + it->first, it->second * sizeof(float));
    hs.to += it->second;
  }
}

absl::Status Replica::Stage(size_t s, const v1::PullResponse& resp) {
  staged_[s] = false;
  if (absl::Status st = StageChunk(s, 0, ranges_[s].size(), resp); !st.ok()) {
    return st;
  }
  return FinishStage(s, resp.replica_checksum());
}

absl::Status Replica::StageChunk(size_t s, uint64_t offset, uint64_t size,
                                 const v1::PullResponse& resp) {
  staged_[s] = false;
  const ShardRange& r = ranges_[s];
  if (offset > r.size() || size > r.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk [", offset, ", ", offset + size, ") is outside shard ", s,
        "'s ", r.size(), " elements"));
  }
  absl::Span<float> out =
      absl::MakeSpan(staging_).subspan(r.begin + offset, size);
  if (resp.kind() != v1::PULL_KIND_SNAPSHOT &&
      resp.kind() != v1::PULL_KIND_DELTA) {
    return absl::InvalidArgumentError("pull response kind is unspecified");
  }
  // Checked once, then decoded with the codec's shared decoder: nothing is
  // allocated per pull.
  absl::StatusOr<ValidatedTensor> valid = ValidateTensor(resp.weights(), size);
  if (!valid.ok()) return valid.status();
  if (resp.kind() == v1::PULL_KIND_SNAPSHOT) {
    valid->DecodeInto(out);
  } else {
    // Validated first: a bad later delta leaves nothing half applied in
    // the caller's view (the staging buffer is scratch until FinishStage).
    std::vector<ValidatedTensor> later;
    later.reserve(resp.later_deltas_size());
    for (int i = 0; i < resp.later_deltas_size(); ++i) {
      absl::StatusOr<ValidatedTensor> v =
          ValidateTensor(resp.later_deltas(i), size);
      if (!v.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("later_deltas[", i, "]: ", v.status().message()));
      }
      later.push_back(*std::move(v));
    }
    // out = now + delta in one pass (the codec's AddValid).
    valid->AddInto(slice(s).subspan(offset, size), out);
    for (const ValidatedTensor& v : later) v.AccumulateInto(1.0f, out);
  }
  HashStaged(s, offset, size);
  return absl::OkStatus();
}

absl::Status Replica::FinishStage(size_t s, uint64_t checksum) {
  const ShardRange& r = ranges_[s];
  absl::Span<const float> out =
      absl::MakeConstSpan(staging_).subspan(r.begin, r.size());
  const Hashing& hs = hashing_[s];
  const uint64_t got = !hs.stale && hs.to == r.size() && hs.waiting.empty()
                           ? hs.h.Finish()
                           : ChecksumOf(out);
  hashing_[s] = Hashing();
  if (got != checksum) {
    return absl::DataLossError(absl::StrCat(
        "replica of shard ", s, " does not match the shard's checksum"));
  }
  staged_checksums_[s] = checksum;
  staged_[s] = true;
  return absl::OkStatus();
}

void Replica::Commit(uint64_t step) {
  ABSL_RAW_CHECK(std::all_of(staged_.begin(), staged_.end(),
                             [](bool b) { return b; }),
                 "Replica::Commit with a shard not staged");
  weights_.swap(staging_);
  checksums_ = staged_checksums_;
  std::fill(steps_.begin(), steps_.end(), step);
  step_ = step;
  BeginUpdate();
}

void Replica::Commit(const std::vector<uint64_t>& steps) {
  ABSL_RAW_CHECK(steps.size() == steps_.size(),
                 "Replica::Commit with another number of shards");
  Commit(steps.empty() ? step_
                       : *std::min_element(steps.begin(), steps.end()));
  steps_ = steps;
}

}  // namespace pserver
