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
  step_ = step;
}

void Replica::BeginUpdate() {
  std::fill(staged_.begin(), staged_.end(), false);
}

absl::Status Replica::Stage(size_t s, const v1::PullResponse& resp) {
  staged_[s] = false;
  const ShardRange& r = ranges_[s];
  absl::Span<float> out = absl::MakeSpan(staging_).subspan(r.begin, r.size());
  if (resp.kind() != v1::PULL_KIND_SNAPSHOT &&
      resp.kind() != v1::PULL_KIND_DELTA) {
    return absl::InvalidArgumentError("pull response kind is unspecified");
  }
  // Checked once, then decoded with the codec's shared decoder: nothing is
  // allocated per pull.
  absl::StatusOr<ValidatedTensor> valid = ValidateTensor(resp.weights(), r.size());
  if (!valid.ok()) return valid.status();
  if (resp.kind() == v1::PULL_KIND_SNAPSHOT) {
    valid->DecodeInto(out);
  } else {
    absl::Span<const float> now = slice(s);
    std::copy(now.begin(), now.end(), out.begin());
    valid->AccumulateInto(1.0f, out);
  }
  if (ChecksumOf(out) != resp.replica_checksum()) {
    return absl::DataLossError(absl::StrCat(
        "replica of shard ", s, " does not match the shard's checksum"));
  }
  staged_checksums_[s] = resp.replica_checksum();
  staged_[s] = true;
  return absl::OkStatus();
}

void Replica::Commit(uint64_t step) {
  ABSL_RAW_CHECK(std::all_of(staged_.begin(), staged_.end(),
                             [](bool b) { return b; }),
                 "Replica::Commit with a shard not staged");
  weights_.swap(staging_);
  checksums_ = staged_checksums_;
  step_ = step;
  BeginUpdate();
}

}  // namespace pserver
