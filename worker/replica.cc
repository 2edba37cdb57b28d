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
  weights_.Allocate(total);  // zeros
  staging_.Release();        // allocated when first needed
  chunks_.assign(ranges_.size(), {});
  checksums_.assign(ranges_.size(), 0);
  staged_checksums_.assign(ranges_.size(), 0);
  staged_.assign(ranges_.size(), false);
  hashing_.assign(ranges_.size(), Hashing());
  steps_.assign(ranges_.size(), step);
  step_ = step;
}

void Replica::Assume(absl::Span<const float> w) {
  ABSL_RAW_CHECK(w.size() == weights_.size(), "Replica::Assume: wrong size");
  std::copy(w.begin(), w.end(), weights_.data());
  for (size_t s = 0; s < ranges_.size(); ++s) {
    checksums_[s] = ChecksumOf(slice(s));
  }
}

void Replica::BeginUpdate() {
  std::fill(staged_.begin(), staged_.end(), false);
  hashing_.assign(ranges_.size(), Hashing());
  for (auto& shard : chunks_) {
    for (auto& [offset, c] : shard) c.present = false;
  }
}

const float* Replica::Values(size_t s, uint64_t offset, const Chunk& c) {
  const uint64_t at = ranges_[s].begin + offset;
  if (c.held == Held::kReplica) return weights_.data() + at;
  if (c.held == Held::kStaging) return staging_.data() + at;
  if (scratch_.size() < c.size) scratch_.resize(c.size);
  absl::Span<float> out = absl::MakeSpan(scratch_).subspan(0, c.size);
  c.valid->AddInto(slice(s).subspan(offset, c.size), out);
  for (const ValidatedTensor& v : c.later_valid) v.AccumulateInto(1.0f, out);
  return scratch_.data();
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
  if (offset != hs.to) {
    hs.waiting[offset] = size;  // early: waits for the chunks before it
    return;
  }
  const std::map<uint64_t, Chunk>& chunks = chunks_[s];
  hs.h.Update(Values(s, offset, chunks.at(offset)), size * sizeof(float));
  hs.to += size;
  for (auto it = hs.waiting.begin();
       it != hs.waiting.end() && it->first == hs.to;
       it = hs.waiting.erase(it)) {
    hs.h.Update(Values(s, it->first, chunks.at(it->first)),
                it->second * sizeof(float));
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

absl::Status Replica::Keep(const v1::PullResponse& resp, uint64_t size,
                           Chunk* c) {
  // Copied into the node (its strings keep their capacity from the last
  // update), then validated there: the tokens point at the copies.
  c->encoded = resp.weights();
  c->later.resize(resp.later_deltas_size());
  for (int i = 0; i < resp.later_deltas_size(); ++i) {
    c->later[i] = resp.later_deltas(i);
  }
  absl::StatusOr<ValidatedTensor> valid = ValidateTensor(c->encoded, size);
  if (!valid.ok()) return valid.status();
  c->valid = *std::move(valid);
  c->later_valid.clear();
  for (size_t i = 0; i < c->later.size(); ++i) {
    absl::StatusOr<ValidatedTensor> v = ValidateTensor(c->later[i], size);
    if (!v.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("later_deltas[", i, "]: ", v.status().message()));
    }
    c->later_valid.push_back(*std::move(v));
  }
  return absl::OkStatus();
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
  if (resp.kind() != v1::PULL_KIND_SNAPSHOT &&
      resp.kind() != v1::PULL_KIND_DELTA &&
      resp.kind() != v1::PULL_KIND_CURRENT) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pull response kind is ",
        v1::PullKind_IsValid(resp.kind()) ? v1::PullKind_Name(resp.kind())
                                          : absl::StrCat(resp.kind()),
        "; expected PULL_KIND_DELTA, PULL_KIND_SNAPSHOT or PULL_KIND_CURRENT"));
  }
  const bool delta = resp.kind() == v1::PULL_KIND_DELTA;
  // A delta of at most a byte per element is kept encoded (the header).
  uint64_t bytes = resp.weights().payload().size();
  for (const v1::EncodedTensor& d : resp.later_deltas()) {
    bytes += d.payload().size();
  }
  Chunk& c = chunks_[s][offset];
  c.present = false;
  c.size = size;
  if (resp.kind() == v1::PULL_KIND_CURRENT) {
    if (bytes > 0 || resp.later_deltas_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a PULL_KIND_CURRENT answer carries ", bytes, " payload bytes and ",
          resp.later_deltas_size(), " later deltas; expected none"));
    }
    c.held = Held::kReplica;
  } else if (delta && bytes <= size) {
    c.held = Held::kKept;
    if (absl::Status st = Keep(resp, size, &c); !st.ok()) return st;
  } else {
    c.held = Held::kStaging;
    // Checked once, then decoded with the codec's shared decoder: nothing
    // is allocated per pull.
    absl::StatusOr<ValidatedTensor> valid =
        ValidateTensor(resp.weights(), size);
    if (!valid.ok()) return valid.status();
    // Validated first: a bad later delta leaves nothing half applied in the
    // caller's view (the staging buffer is scratch until FinishStage).
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
    if (staging_.size() != weights_.size()) staging_.Allocate(weights_.size());
    absl::Span<float> out = staging_.span().subspan(r.begin + offset, size);
    if (!delta) {
      valid->DecodeInto(out);
    } else {
      // out = now + delta in one pass (the codec's AddValid).
      valid->AddInto(slice(s).subspan(offset, size), out);
      for (const ValidatedTensor& v : later) v.AccumulateInto(1.0f, out);
    }
  }
  c.present = true;
  HashStaged(s, offset, size);
  return absl::OkStatus();
}

absl::Status Replica::FinishStage(size_t s, uint64_t checksum) {
  const ShardRange& r = ranges_[s];
  const Hashing& hs = hashing_[s];
  uint64_t got = 0;
  if (!hs.stale && hs.to == r.size() && hs.waiting.empty()) {
    got = hs.h.Finish();
  } else {
    // Hashed whole, in slice order, from the newest answer of each chunk;
    // a gap (a chunk missing) cannot match.
    Checksum64 h;
    uint64_t to = 0;
    for (const auto& [offset, c] : chunks_[s]) {
      if (!c.present) continue;
      if (offset != to) break;
      h.Update(Values(s, offset, c), c.size * sizeof(float));
      to += c.size;
    }
    got = to == r.size() ? h.Finish() : ~checksum;
  }
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
  // in_place: some chunk is applied to (or kept in) weights_ itself.
  bool in_place = false, any_staged = false;
  for (const auto& shard : chunks_) {
    for (const auto& [offset, c] : shard) {
      if (!c.present) continue;
      in_place |= c.held != Held::kStaging;
      any_staged |= c.held == Held::kStaging;
    }
  }
  if (!in_place) {
    weights_.swap(staging_);  // every slice is in the staging buffer
  } else {
    for (size_t s = 0; s < chunks_.size(); ++s) {
      const uint64_t begin = ranges_[s].begin;
      for (const auto& [offset, c] : chunks_[s]) {
        if (!c.present || c.held == Held::kReplica) continue;
        absl::Span<float> out = weights_.span().subspan(begin + offset, c.size);
        if (c.held == Held::kKept) {
          // The same arithmetic as Values: the bits FinishStage hashed.
          c.valid->AddInto(out, out);
          for (const ValidatedTensor& v : c.later_valid) {
            v.AccumulateInto(1.0f, out);
          }
        } else {
          std::copy_n(staging_.data() + begin + offset, c.size, out.begin());
        }
      }
    }
  }
  // Kept while the pulls use it (fp32 pulls: every step); an update that
  // did not (compressed deltas) gives it back.
  if (!any_staged) staging_.Release();
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
