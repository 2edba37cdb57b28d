// The index part of topk and topk_quantize payloads: varint count c, then c
// varint gaps (first: the index itself; then index - previous - 1), so
// indices strictly increase and a gap below 128 takes one byte.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/impl/topk_select.h"
#include "common/internal/varint.h"

namespace pserver {
namespace impl {

namespace {

// Gaps below 2^14 (all but a few at any density worth sending) take one or
// two bytes: their varint as two bytes, of which the second is kept only if
// the gap needs it.
constexpr uint64_t kShortGap = uint64_t{1} << 14;

inline uint32_t TwoBytes(uint64_t gap, uint32_t more) {
  return static_cast<uint32_t>((gap & 0x7f) | (more << 7) | ((gap >> 7) << 8));
}

// PutVarint for one gap, branch-free when it is short.
// REQUIRES: kMaxVarintBytes of room at p.
inline uint8_t* PutGap(uint64_t gap, uint8_t* p) {
  if (gap >= kShortGap) return internal::PutVarint(gap, p);
  const uint32_t more = gap >= 0x80;
  const uint16_t two = static_cast<uint16_t>(TwoBytes(gap, more));
  std::memcpy(p, &two, 2);
  return p + 1 + more;
}

}  // namespace

void AppendIndices(absl::Span<const uint64_t> idx, Buffer<uint8_t>* bytes,
                   std::string* out) {
  // Staged in *bytes a chunk at a time (small, and no zero-fill, unlike
  // growing the string), then appended.
  constexpr size_t kChunk = 4096;
  uint8_t* const start =
      bytes->Reserve((kChunk + 2) * internal::kMaxVarintBytes);
  out->reserve(out->size() + idx.size() * 2 + 2 * internal::kMaxVarintBytes);
  uint8_t* p = internal::PutVarint(idx.size(), start);
  if (!idx.empty()) p = internal::PutVarint(idx[0], p);
  for (size_t j = 1; j < idx.size();) {
    const size_t end = std::min(idx.size(), j + kChunk);
    // Two short gaps per step, in one 4-byte store.
    for (; j + 2 <= end; j += 2) {
      const uint64_t g0 = idx[j] - idx[j - 1] - 1;
      const uint64_t g1 = idx[j + 1] - idx[j] - 1;
      if ((g0 | g1) >= kShortGap) {
        p = internal::PutVarint(g1, internal::PutVarint(g0, p));
        continue;
      }
      const uint32_t m0 = g0 >= 0x80, m1 = g1 >= 0x80;
      const uint32_t both = TwoBytes(g0, m0) | TwoBytes(g1, m1) << (8 + 8 * m0);
      std::memcpy(p, &both, 4);
      p += 2 + m0 + m1;
    }
    for (; j < end; ++j) p = PutGap(idx[j] - idx[j - 1] - 1, p);
    out->append(reinterpret_cast<const char*>(start),
                static_cast<size_t>(p - start));
    p = start;
  }
  if (p != start) {  // the count (and first index) alone
    out->append(reinterpret_cast<const char*>(start),
                static_cast<size_t>(p - start));
  }
}

absl::Status ParseIndices(absl::string_view payload, uint64_t n,
                          uint64_t* count, size_t* values_offset,
                          absl::string_view unit) {
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
        "payload count is ", *count, "; expected at most ", n, " (", unit, ")"));
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
