// The index part of topk and topk_quantize payloads: varint count c, then c
// varint gaps (first: the index itself; then index - previous - 1), so
// indices strictly increase and a gap below 128 takes one byte.
#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/internal/varint.h"

namespace pserver {
namespace impl {

void AppendIndices(absl::Span<const uint64_t> idx, std::string* out) {
  size_t old = out->size();
  out->resize(old + (idx.size() + 1) * internal::kMaxVarintBytes);
  uint8_t* start = reinterpret_cast<uint8_t*>(&(*out)[0]);
  uint8_t* p = internal::PutVarint(idx.size(), start + old);
  for (size_t j = 0; j < idx.size(); ++j) {
    p = internal::PutVarint(j == 0 ? idx[0] : idx[j] - idx[j - 1] - 1, p);
  }
  out->resize(static_cast<size_t>(p - start));
}

absl::Status ParseIndices(absl::string_view payload, uint64_t n,
                          uint64_t* count, size_t* values_offset) {
  const uint8_t* begin = reinterpret_cast<const uint8_t*>(payload.data());
  const uint8_t* p = begin;
  const uint8_t* end = p + payload.size();
  internal::VarintResult r = internal::GetVarint(&p, end, count);
  if (r != internal::VarintResult::kOk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload count varint is ",
        r == internal::VarintResult::kTruncated ? "truncated" : "over 64 bits",
        "; expected a varint count <= ", n));
  }
  if (*count > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload count is ", *count, "; expected at most ", n, " (num_elements)"));
  }
  // Each gap takes at least one byte: refuse a count the payload cannot hold
  // before looping over it.
  if (*count > payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload count is ", *count, " but the payload is only ",
        payload.size(), " bytes; expected at least one byte per index"));
  }
  uint64_t index = 0;
  for (uint64_t j = 0; j < *count; ++j) {
    uint64_t gap;
    r = internal::GetVarint(&p, end, &gap);
    if (r != internal::VarintResult::kOk) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index gap ", j, " is ",
          r == internal::VarintResult::kTruncated ? "truncated" : "over 64 bits",
          "; expected a varint"));
    }
    // index + gap + 1 < n, written so that nothing overflows.
    if (j == 0 ? gap >= n : (gap >= n || index >= n - 1 - gap)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index ", j, " (gap ", gap, " after ", j == 0 ? 0 : index,
          ") is out of range; expected increasing indices below ", n));
    }
    index = j == 0 ? gap : index + gap + 1;
  }
  *values_offset = static_cast<size_t>(p - begin);
  return absl::OkStatus();
}

}  // namespace impl
}  // namespace pserver
