#include "common/unchanged.h"

#include "common/impl/codecs.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

namespace pserver {
namespace {

// fn(piece, begin) for t itself or each of its segments, begin the piece's
// first slice element.
template <typename Tensor, typename Fn>
void ForEachPiece(Tensor* t, uint64_t offset, Fn fn) {
  if (t->codec() != v1::CODEC_SEGMENTS) {
    fn(t, offset, -1);
    return;
  }
  uint64_t at = offset;
  for (int i = 0; i < t->segments_size(); ++i) {
    auto* s = [&] {
      if constexpr (std::is_const_v<Tensor>) {
        return &t->segments(i);
      } else {
        return t->mutable_segments(i);
      }
    }();
    const uint64_t n = s->num_elements();
    fn(s, at, i);
    at += n;
  }
}

// The end of the range holding `begin`, or `begin` when none does.
uint64_t CoveredUntil(absl::Span<const ElementRanges::value_type> ranges,
                      uint64_t begin) {
  auto it = std::upper_bound(
      ranges.begin(), ranges.end(), begin,
      [](uint64_t v, const ElementRanges::value_type& r) { return v < r.first; });
  if (it == ranges.begin()) return begin;
  --it;
  return begin < it->second ? it->second : begin;
}

}  // namespace

ElementRanges BufferRanges(const std::vector<TensorSlot>& slots,
                           ShardRange range) {
  ElementRanges out;
  for (const TensorSlot& t : slots) {
    const uint64_t b = std::max(t.offset, range.begin);
    const uint64_t e = std::min(t.offset + t.size, range.end);
    if (t.buffer && b < e) out.emplace_back(b - range.begin, e - range.begin);
  }
  return out;
}

uint64_t MarkUnchanged(
    v1::EncodedTensor* t, uint64_t offset,
    absl::Span<const ElementRanges::value_type> ranges,
    absl::FunctionRef<bool(uint64_t begin, absl::string_view fp32)> same) {
  if (ranges.empty()) return 0;
  // A piece's runs of buffer tensors that are the same (or not): a piece
  // is cut where that changes, unless the cuts would make more segments
  // than a tensor may hold; then only whole pieces are marked.
  struct Run {
    uint64_t begin, end;
    bool same;
  };
  std::vector<std::vector<Run>> runs;  // per piece; empty: not a candidate
  size_t segments = 0;
  ForEachPiece(t, offset, [&](v1::EncodedTensor* p, uint64_t begin, int) {
    runs.emplace_back();
    ++segments;
    const uint64_t n = p->num_elements();
    const uint64_t end = begin + n;
    if (p->codec() != v1::CODEC_FP32 || n == 0 ||
        p->payload().size() != n * sizeof(float)) {
      return;
    }
    for (uint64_t at = begin; at < end;) {
      const uint64_t until = CoveredUntil(ranges, at);
      if (until == at) {
        runs.back().clear();  // not all buffers
        return;
      }
      at = until;
    }
    std::vector<Run>& r = runs.back();
    auto it = std::upper_bound(
        ranges.begin(), ranges.end(), begin,
        [](uint64_t v, const ElementRanges::value_type& x) {
          return v < x.first;
        });
    if (it != ranges.begin()) --it;
    for (; it != ranges.end() && it->first < end; ++it) {
      const uint64_t lo = std::max(it->first, begin);
      const uint64_t hi = std::min(it->second, end);
      if (lo >= hi) continue;
      const bool s = same(
          lo, absl::string_view(p->payload()).substr(
                  (lo - begin) * sizeof(float), (hi - lo) * sizeof(float)));
      if (!r.empty() && r.back().same == s && r.back().end == lo) {
        r.back().end = hi;
      } else {
        r.push_back(Run{lo, hi, s});
      }
    }
    segments += r.size() - 1;
  });
  // Runs of equal flags are joined: more than one run is a mixed piece.
  const bool cut = segments <= static_cast<size_t>(impl::kMaxSegments);
  auto all_same = [](const std::vector<Run>& r) {
    return r.size() == 1 && r[0].same;
  };
  if (std::none_of(runs.begin(), runs.end(), [&](const std::vector<Run>& r) {
        return all_same(r) || (cut && r.size() > 1);
      })) {
    return 0;
  }
  // The pieces again, marked and, where allowed, cut.
  std::vector<v1::EncodedTensor> pieces;
  uint64_t marked = 0;
  size_t i = 0;
  ForEachPiece(t, offset, [&](v1::EncodedTensor* p, uint64_t begin, int) {
    const std::vector<Run>& r = runs[i++];
    if (all_same(r)) {
      p->set_codec(v1::CODEC_UNCHANGED);
      p->clear_payload();
      p->clear_params();
      marked += p->num_elements();
      pieces.push_back(std::move(*p));
    } else if (r.size() > 1 && cut) {
      for (const Run& x : r) {
        v1::EncodedTensor& q = pieces.emplace_back();
        q.set_num_elements(x.end - x.begin);
        if (x.same) {
          q.set_codec(v1::CODEC_UNCHANGED);
          marked += x.end - x.begin;
        } else {
          q.set_codec(v1::CODEC_FP32);
          q.set_payload(p->payload().substr((x.begin - begin) * sizeof(float),
                                            (x.end - x.begin) * sizeof(float)));
        }
      }
    } else {
      pieces.push_back(std::move(*p));
    }
  });
  if (pieces.size() == 1) {
    *t = std::move(pieces[0]);
    return marked;
  }
  const uint64_t total = t->num_elements();
  t->Clear();
  t->set_codec(v1::CODEC_SEGMENTS);
  t->set_num_elements(total);
  for (v1::EncodedTensor& q : pieces) *t->add_segments() = std::move(q);
  return marked;
}

bool AllZero(absl::string_view fp32) {
  uint32_t any = 0;
  for (size_t i = 0; i + 4 <= fp32.size(); i += 4) {
    uint32_t bits;
    std::memcpy(&bits, fp32.data() + i, 4);
    any |= bits & 0x7fffffffu;
  }
  return any == 0;
}

bool HasUnchanged(const v1::EncodedTensor& t) {
  bool any = false;
  ForEachPiece(&t, 0, [&](const v1::EncodedTensor* p, uint64_t, int) {
    any = any || p->codec() == v1::CODEC_UNCHANGED;
  });
  return any;
}

std::optional<OutsidePiece> UnchangedOutside(
    const v1::EncodedTensor& t, uint64_t offset,
    absl::Span<const ElementRanges::value_type> ranges) {
  std::optional<OutsidePiece> out;
  ForEachPiece(&t, offset, [&](const v1::EncodedTensor* p, uint64_t begin,
                               int i) {
    if (out.has_value() || p->codec() != v1::CODEC_UNCHANGED) return;
    const uint64_t end = begin + p->num_elements();
    for (uint64_t at = begin; at < end;) {
      const uint64_t until = CoveredUntil(ranges, at);
      if (until == at) {
        out = OutsidePiece{i, at};
        return;
      }
      at = until;
    }
  });
  return out;
}

std::optional<OutsidePiece> NoGradientOver(
    const v1::EncodedTensor& t, uint64_t offset,
    absl::Span<const ElementRanges::value_type> ranges) {
  std::optional<OutsidePiece> out;
  ForEachPiece(&t, offset, [&](const v1::EncodedTensor* p, uint64_t begin,
                               int i) {
    if (out.has_value() || p->codec() != v1::CODEC_NO_GRADIENT) return;
    const uint64_t end = begin + p->num_elements();
    for (const auto& [b, e] : ranges) {
      if (b < end && begin < e) {
        out = OutsidePiece{i, std::max(b, begin)};
        return;
      }
    }
  });
  return out;
}

void FillUnchanged(v1::EncodedTensor* t, absl::Span<const float> values) {
  ForEachPiece(t, 0, [&](v1::EncodedTensor* p, uint64_t begin, int) {
    if (p->codec() != v1::CODEC_UNCHANGED) return;
    const uint64_t n = p->num_elements();
    p->set_codec(v1::CODEC_FP32);
    p->clear_params();
    p->set_payload(std::string(
        reinterpret_cast<const char*>(values.data() + begin),
        n * sizeof(float)));
  });
}

}  // namespace pserver
