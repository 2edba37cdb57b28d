// Which chunks of a step's gradient are ready to push, for overlapped steps
// (Client::StartStep / GradientReady / FinishStep): the caller hands ranges
// of the flat gradient over as backward produces them (per tensor or per
// bucket, in any order), and a chunk of a shard becomes pushable once every
// element of it was handed over. The push thread takes ready chunks in the
// order they became ready, so a backward pass that finishes the last layers
// first has them on the wire while it computes the first ones.
#ifndef PSERVER_WORKER_READY_CHUNKS_H_
#define PSERVER_WORKER_READY_CHUNKS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/chunking.h"
#include "common/layout.h"

namespace pserver {

// Thread-safe: the caller's thread marks ranges, the push thread takes
// chunks.
class ReadyChunks {
 public:
  // A new step over `total` elements; shard s owns ranges[s], cut into
  // plans[s]'s chunks. Nothing is ready.
  void Reset(uint64_t total, const std::vector<ShardRange>& ranges,
             const std::vector<ChunkPlan>& plans) ABSL_LOCKS_EXCLUDED(mu_);
  // Elements [begin, end) of the flat gradient hold their final values.
  // INVALID_ARGUMENT (nothing marked) when the range is empty, outside the
  // gradient, or overlaps a range handed over before in this step.
  absl::Status Mark(uint64_t begin, uint64_t end) ABSL_LOCKS_EXCLUDED(mu_);
  // The ranges not handed over yet, in order.
  std::vector<std::pair<uint64_t, uint64_t>> Missing() const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A ready chunk of shard s not taken yet (oldest first), or -1.
  int64_t Take(size_t s) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ShardRange> ranges_ ABSL_GUARDED_BY(mu_);
  std::vector<ChunkPlan> plans_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> marked_ ABSL_GUARDED_BY(mu_);  // begin -> end
  // Per shard: elements of each chunk still missing; ready chunks in order.
  std::vector<std::vector<uint64_t>> missing_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<uint32_t>> ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_WORKER_READY_CHUNKS_H_
