#include "common/layout.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pserver {
namespace {

std::string ShapeString(const v1::TensorSpec& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ","), "]");
}

}  // namespace

absl::StatusOr<std::vector<TensorSlot>> ValidateLayout(
    const v1::ModelLayout& layout) {
  if (layout.tensors_size() == 0) {
    return absl::InvalidArgumentError(
        "layout.tensors is empty; expected at least one tensor");
  }
  std::vector<TensorSlot> slots;
  slots.reserve(layout.tensors_size());
  absl::flat_hash_set<std::string> names;
  uint64_t offset = 0;
  for (int i = 0; i < layout.tensors_size(); ++i) {
    const v1::TensorSpec& t = layout.tensors(i);
    if (t.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout.tensors[", i, "].name is empty"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layout.tensors[", i, "].name '", t.name(), "' is repeated"));
    }
    uint64_t size = 1;
    for (int d = 0; d < t.shape_size(); ++d) {
      uint64_t dim = t.shape(d);
      if (dim == 0 || dim > kMaxModelElements) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layout.tensors[", i, "].shape[", d, "] is ", dim,
            "; expected 1..", kMaxModelElements));
      }
      size *= dim;
      if (size > kMaxModelElements) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layout.tensors[", i, "] has more than ", kMaxModelElements,
            " elements"));
      }
    }
    if (offset + size > kMaxModelElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layout has more than ", kMaxModelElements, " elements in total"));
    }
    const uint64_t rows =
        t.shape_size() >= 2 ? t.shape(t.shape_size() - 1) : 0;
    slots.push_back(TensorSlot{t.name(), offset, size, rows});
    offset += size;
  }
  return slots;
}

uint64_t TotalElements(const v1::ModelLayout& layout) {
  uint64_t total = 0;
  for (const v1::TensorSpec& t : layout.tensors()) {
    uint64_t size = 1;
    for (uint64_t d : t.shape()) size *= d;
    total += size;
  }
  return total;
}

ShardRange ShardRangeFor(uint64_t total, uint32_t count, uint32_t index) {
  uint64_t blocks = (total + kShardAlignment - 1) / kShardAlignment;
  uint64_t base = blocks / count;
  uint64_t extra = blocks % count;  // the first `extra` shards get one more
  uint64_t first_block = index * base + std::min<uint64_t>(index, extra);
  uint64_t nblocks = base + (index < extra ? 1 : 0);
  ShardRange r;
  r.begin = std::min(total, first_block * kShardAlignment);
  r.end = std::min(total, (first_block + nblocks) * kShardAlignment);
  return r;
}

std::string FirstLayoutDifference(const v1::ModelLayout& got,
                                  const v1::ModelLayout& expected) {
  int n = std::min(got.tensors_size(), expected.tensors_size());
  for (int i = 0; i < n; ++i) {
    const v1::TensorSpec& a = got.tensors(i);
    const v1::TensorSpec& b = expected.tensors(i);
    if (a.name() != b.name()) {
      return absl::StrCat("layout.tensors[", i, "].name is '", a.name(),
                          "', expected '", b.name(), "'");
    }
    if (a.shape_size() != b.shape_size()) {
      return absl::StrCat("layout.tensors[", i, "] ('", a.name(),
                          "').shape is ", ShapeString(a), ", expected ",
                          ShapeString(b));
    }
    for (int d = 0; d < a.shape_size(); ++d) {
      if (a.shape(d) != b.shape(d)) {
        return absl::StrCat("layout.tensors[", i, "] ('", a.name(),
                            "').shape[", d, "] is ", a.shape(d),
                            ", expected ", b.shape(d));
      }
    }
  }
  if (got.tensors_size() != expected.tensors_size()) {
    return absl::StrCat("layout has ", got.tensors_size(),
                        " tensors, expected ", expected.tensors_size());
  }
  return "";
}

}  // namespace pserver
