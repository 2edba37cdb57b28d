// How a shard's slice is cut into chunks for pushes and pulls
// (parameter_server.proto, "Chunks"): chunk c covers slice elements
// [c * chunk_elements, min((c + 1) * chunk_elements, n)). An empty slice is
// one empty chunk, so every shard has at least one chunk call per step.
#ifndef PSERVER_COMMON_CHUNKING_H_
#define PSERVER_COMMON_CHUNKING_H_

#include <algorithm>
#include <cstdint>

namespace pserver {

// 1 Mi elements: 4 MiB of fp32 per chunk message, a multiple of every
// power-of-two codec block size.
inline constexpr uint64_t kDefaultChunkElements = uint64_t{1} << 20;
// Bounds a shard accepts for --chunk_elements (and a client for what a shard
// announces): at least 1 Ki elements, at most 64 Mi elements
// (256 MiB of fp32 per message).
inline constexpr uint64_t kMinChunkElements = uint64_t{1} << 10;
inline constexpr uint64_t kMaxChunkElements = uint64_t{1} << 26;
// GetShardState / InstallShardState move a shard's state in chunks of this
// many bytes (parameter_server.proto, "Shard state transfer").
inline constexpr uint64_t kShardStateChunkBytes = uint64_t{4} << 20;

struct ChunkPlan {
  uint64_t n = 0;                            // elements of the slice
  uint64_t chunk_elements = kDefaultChunkElements;  // > 0

  uint32_t num_chunks() const {
    if (n == 0) return 1;
    return static_cast<uint32_t>((n + chunk_elements - 1) / chunk_elements);
  }
  uint64_t begin(uint32_t c) const { return std::min(n, c * chunk_elements); }
  uint64_t end(uint32_t c) const {
    return std::min(n, (uint64_t{c} + 1) * chunk_elements);
  }
  uint64_t size(uint32_t c) const { return end(c) - begin(c); }
};

}  // namespace pserver

#endif  // PSERVER_COMMON_CHUNKING_H_
