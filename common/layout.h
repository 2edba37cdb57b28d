// The model layout (named tensors laid end to end in one flat fp32 space) and
// how it is split into shards.
#ifndef PSERVER_COMMON_LAYOUT_H_
#define PSERVER_COMMON_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

// Shards are aligned to this many elements so that codec blocks never
// straddle a shard boundary.
inline constexpr uint64_t kShardAlignment = 256;

// Largest model accepted, in elements (fp32 snapshots must fit a 2 GiB
// protobuf message per shard even with one shard).
inline constexpr uint64_t kMaxModelElements = uint64_t{1} << 29;

struct ShardRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

// One tensor's place in the flat space.
struct TensorSlot {
  std::string name;
  uint64_t offset = 0;
  uint64_t size = 0;
  // The last dimension of a tensor of two or more dimensions (its rows, for
  // block_topk's row_length); 0 for vectors and scalars.
  uint64_t row_length = 0;
  uint32_t group = 0;   // v1::TensorSpec.group
  // v1::TENSOR_KIND_BUFFER or _BROADCAST_BUFFER: not optimized, the
  // round's mean (broadcast: worker 0's values) instead.
  bool buffer = false;
  bool broadcast = false;  // v1::TENSOR_KIND_BROADCAST_BUFFER
};

// Most hyper-parameter groups a layout may name (v1::ModelLayout.groups).
inline constexpr int kMaxParamGroups = 256;

// The groups of a layout: max(1, layout.groups_size()).
inline int GroupCount(const v1::ModelLayout& layout) {
  return layout.groups_size() > 0 ? layout.groups_size() : 1;
}

// Checks that every tensor has a non-empty unique name, a shape of positive
// dimensions, a known kind and a group the layout has (groups: at most
// kMaxParamGroups, each lr_scale and weight_decay finite and >= 0), and that
// the total is within kMaxModelElements.
// INVALID_ARGUMENT names the offending field (e.g. "layout.tensors[3].shape").
absl::StatusOr<std::vector<TensorSlot>> ValidateLayout(
    const v1::ModelLayout& layout);

uint64_t TotalElements(const v1::ModelLayout& layout);

// Shard `index` of `count` over `total` elements: contiguous, in index order,
// each a multiple of kShardAlignment long except possibly the last, sizes as
// equal as that allows. Shards may be empty when total is small.
// REQUIRES: count > 0, index < count.
ShardRange ShardRangeFor(uint64_t total, uint32_t count, uint32_t index);

// Empty string when the layouts are identical; otherwise a description of the
// first difference, e.g. "tensors[1].shape[0] is 128, expected 256".
std::string FirstLayoutDifference(const v1::ModelLayout& got,
                                  const v1::ModelLayout& expected);

}  // namespace pserver

#endif  // PSERVER_COMMON_LAYOUT_H_
