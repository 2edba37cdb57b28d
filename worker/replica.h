// The worker's replica x̂ of the shards' weights: the flat vector every
// worker holds for the same step, the step, and per shard the Checksum64 of
// its slice as the shard confirmed it. A pull's answers change it all or
// nothing (hole 7): each shard's answer is staged and checked against the
// shard's checksum, and only when every shard's answer verified does Commit
// make them the replica, at the new step.
//
// Memory: a chunk answered with a compressed delta (at most a byte per
// element: 1-bit, TopK, 8-bit and below) is kept encoded, hashed through a
// chunk-sized scratch buffer, and added to the replica in place at Commit:
// nothing model-sized besides the replica (a 1-bit delta is 1/32 of it), at
// the cost of decoding it twice. Any other chunk (a snapshot, such as every
// fp32 pull; a 16-bit delta) is decoded into a staging buffer, a second
// fp32 copy of the model: allocated when first needed, kept while the
// updates use it (Commit swaps the two buffers: nothing is copied), given
// back by a commit that did not use it and by ReleaseStaging (the client's
// Register, after the initial snapshot).
//
// Usage:
//   replica.BeginUpdate();
//   for (s ...) if (!replica.Stage(s, resp[s]).ok()) { /* re-pull or fail */ }
//   replica.Commit(step + 1);   // only when every shard is staged
#ifndef PSERVER_WORKER_REPLICA_H_
#define PSERVER_WORKER_REPLICA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/checksum.h"
#include "common/layout.h"
#include "common/validated_tensor.h"
#include "worker/page_buffer.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

// Thread-compatible: the thread driving the Client owns it.
class Replica {
 public:
  Replica() = default;

  // Zero weights for `total` parameters split into `ranges` (shard s owns
  // ranges[s]), at `step`, with nothing staged.
  void Reset(uint64_t total, std::vector<ShardRange> ranges, uint64_t step);
  // Takes `w` as the weights (at the current step), each slice's checksum
  // computed from them: a pull of this step can then prove the replica
  // holds them, and a shard whose x_hat is the same answers with nothing
  // (PULL_KIND_CURRENT) instead of a snapshot. REQUIRES: w.size() is the
  // total of Reset.
  void Assume(absl::Span<const float> w);

  absl::Span<const float> weights() const { return weights_.span(); }
  // The step of the replica: the lowest of the shards' (under bsp every
  // shard's slice is of the same step; under ssp and async each shard's may
  // be its own, see step(s)).
  uint64_t step() const { return step_; }
  // The step of shard s's slice.
  uint64_t step(size_t s) const { return steps_[s]; }
  size_t num_shards() const { return ranges_.size(); }
  const ShardRange& range(size_t s) const { return ranges_[s]; }
  absl::Span<const float> slice(size_t s) const {
    return weights_.span().subspan(ranges_[s].begin, ranges_[s].size());
  }
  // Checksum64 of slice(s) as the shard confirmed it at the last commit
  // (sent back with the next delta pull, not recomputed).
  uint64_t checksum(size_t s) const { return checksums_[s]; }

  // Forgets anything staged.
  void BeginUpdate();
  // Stages shard s's pull answer: a snapshot replaces slice(s), a delta is
  // added to it (at Commit), a CURRENT answer keeps it. Does not change
  // weights(). INVALID_ARGUMENT when the answer does not decode (or its
  // kind is unspecified, or a CURRENT answer carries weights);
  // DATA_LOSS when the result does not match resp.replica_checksum(). On
  // error shard s is not staged.
  absl::Status Stage(size_t s, const v1::PullResponse& resp);
  // The same in chunks: StageChunk stages one chunk's answer (elements
  // [offset, offset + size) of slice s; see Memory above); once every
  // chunk is in, FinishStage checks the staged slice against `checksum` and
  // marks it staged. INVALID_ARGUMENT / DATA_LOSS as Stage. Chunks are
  // hashed as they are staged, in slice order (one that arrives early waits
  // for those before it), while later chunks are still on the wire; a slice
  // whose chunks were not all hashed once in order (a chunk staged again)
  // is hashed whole by FinishStage instead, and one with a chunk missing
  // does not verify.
  absl::Status StageChunk(size_t s, uint64_t offset, uint64_t size,
                          const v1::PullResponse& resp);
  absl::Status FinishStage(size_t s, uint64_t checksum);
  bool staged(size_t s) const { return staged_[s]; }
  // Makes every staged slice the replica, at `step`. REQUIRES: every shard
  // staged since BeginUpdate().
  void Commit(uint64_t step);
  // The same, with each shard's slice at its own step (steps[s]).
  void Commit(const std::vector<uint64_t>& steps);
  // Gives the staging buffer back (allocated again when next needed).
  void ReleaseStaging() { staging_.Release(); }
  // Whether the staging buffer is allocated (for the tests of its life).
  bool has_staging_buffer() const { return !staging_.empty(); }

 private:
  // One chunk of a shard's answer since BeginUpdate: decoded into staging_,
  // or kept encoded (a compressed delta, with its validation tokens, which
  // point into this node: std::map nodes do not move). Nodes are reused
  // across updates (`present`), so a steady pull allocates nothing.
  // Where a chunk's staged values are: decoded into staging_, kept encoded
  // (added to weights_ at Commit), or weights_ itself (a CURRENT answer).
  enum class Held { kStaging, kKept, kReplica };
  struct Chunk {
    bool present = false;
    uint64_t size = 0;
    Held held = Held::kStaging;
    v1::EncodedTensor encoded;
    std::vector<v1::EncodedTensor> later;
    std::optional<ValidatedTensor> valid;
    std::vector<ValidatedTensor> later_valid;
  };
  // Keeps resp's delta in `c`, validated. On error `c` is not present.
  absl::Status Keep(const v1::PullResponse& resp, uint64_t size, Chunk* c);
  // Chunk (s, offset)'s staged values (see Held; a kept chunk's are slice
  // + delta computed into scratch_, valid until the next call).
  const float* Values(size_t s, uint64_t offset, const Chunk& c);

  std::vector<ShardRange> ranges_;
  // Both from the kernel (worker/page_buffer.h): the staging buffer's pages
  // go back when it is released.
  PageBuffer weights_;
  PageBuffer staging_;  // empty, or the size of weights_
  std::vector<float> scratch_;  // one kept chunk's staged values
  std::vector<std::map<uint64_t, Chunk>> chunks_;  // per shard, by offset
  std::vector<uint64_t> checksums_;
  std::vector<uint64_t> staged_checksums_;
  std::vector<bool> staged_;
  // Per shard: the Checksum64 of the staged slice's prefix [0, to), the
  // chunks staged past it (offset -> size), and whether a chunk inside the
  // prefix was staged again (the running hash is then stale).
  struct Hashing {
    Checksum64 h;
    uint64_t to = 0;
    std::map<uint64_t, uint64_t> waiting;
    bool stale = false;
  };
  void HashStaged(size_t s, uint64_t offset, uint64_t size);
  std::vector<Hashing> hashing_;
  std::vector<uint64_t> steps_;  // per shard
  uint64_t step_ = 0;            // the lowest of steps_
};

}  // namespace pserver

#endif  // PSERVER_WORKER_REPLICA_H_
