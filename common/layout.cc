#include "common/layout.h"

#include <algorithm>
#include <cmath>

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
  if (layout.groups_size() > kMaxParamGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.groups has ", layout.groups_size(),
                     " groups; expected at most ", kMaxParamGroups));
  }
  for (int g = 0; g < layout.groups_size(); ++g) {
    const v1::ParamGroup& group = layout.groups(g);
    auto bad = [](float x) { return !std::isfinite(x) || x < 0.0f; };
    if (group.has_lr_scale() && bad(group.lr_scale())) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout.groups[", g, "].lr_scale is ",
                       group.lr_scale(), "; expected a finite value >= 0"));
    }
    if (group.has_weight_decay() && bad(group.weight_decay())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layout.groups[", g, "].weight_decay is ", group.weight_decay(),
          "; expected a finite value >= 0"));
    }
  }
  const int groups = GroupCount(layout);
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
    if (t.group() >= static_cast<uint32_t>(groups)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layout.tensors[", i, "].group is ", t.group(), "; expected 0..",
          groups - 1, " (layout.groups has ", layout.groups_size(), ")"));
    }
    if (!v1::TensorKind_IsValid(t.kind())) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout.tensors[", i, "].kind is ", t.kind(),
                       "; expected TENSOR_KIND_PARAMETER, TENSOR_KIND_BUFFER "
                       "or TENSOR_KIND_BROADCAST_BUFFER"));
    }
    const uint64_t rows =
        t.shape_size() >= 2 ? t.shape(t.shape_size() - 1) : 0;
    const bool broadcast = t.kind() == v1::TENSOR_KIND_BROADCAST_BUFFER;
    slots.push_back(TensorSlot{t.name(), offset, size, rows, t.group(),
                               t.kind() == v1::TENSOR_KIND_BUFFER || broadcast,
                               broadcast});
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

namespace {

std::string KindName(v1::TensorKind kind) {
  switch (kind) {
    case v1::TENSOR_KIND_BUFFER: return "buffer";
    case v1::TENSOR_KIND_BROADCAST_BUFFER: return "broadcast buffer";
    default: return "parameter";
  }
}

// Group g of `l` (a default group past its groups) with lr_scale set.
v1::ParamGroup NormalizedGroup(const v1::ModelLayout& l, int g) {
  v1::ParamGroup out;
  if (g < l.groups_size()) out = l.groups(g);
  if (!out.has_lr_scale()) out.set_lr_scale(1.0f);
  return out;
}

std::string GroupString(const v1::ParamGroup& g) {
  return absl::StrCat(
      "{lr_scale ", g.has_lr_scale() ? absl::StrCat(g.lr_scale()) : "unset",
      ", weight_decay ",
      g.has_weight_decay() ? absl::StrCat(g.weight_decay()) : "unset", "}");
}

}  // namespace

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
    if (a.group() != b.group()) {
      return absl::StrCat("layout.tensors[", i, "] ('", a.name(),
                          "').group is ", a.group(), ", expected ", b.group());
    }
    if (KindName(a.kind()) != KindName(b.kind())) {
      return absl::StrCat("layout.tensors[", i, "] ('", a.name(),
                          "').kind is ", KindName(a.kind()), ", expected ",
                          KindName(b.kind()));
    }
  }
  if (got.tensors_size() != expected.tensors_size()) {
    return absl::StrCat("layout has ", got.tensors_size(),
                        " tensors, expected ", expected.tensors_size());
  }
  // No groups is one group of defaults, and an unset lr_scale is 1: a
  // layout written before groups existed (a checkpoint, a C++ worker's)
  // equals one that spells the defaults out.
  if (GroupCount(got) != GroupCount(expected)) {
    return absl::StrCat("layout has ", GroupCount(got), " groups, expected ",
                        GroupCount(expected));
  }
  for (int g = 0; g < GroupCount(got); ++g) {
    const v1::ParamGroup a = NormalizedGroup(got, g);
    const v1::ParamGroup b = NormalizedGroup(expected, g);
    if (a.lr_scale() != b.lr_scale() ||
        a.has_weight_decay() != b.has_weight_decay() ||
        a.weight_decay() != b.weight_decay()) {
      return absl::StrCat("layout.groups[", g, "] is ", GroupString(a),
                          ", expected ", GroupString(b));
    }
  }
  return "";
}

}  // namespace pserver
