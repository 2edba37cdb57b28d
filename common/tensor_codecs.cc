#include "common/tensor_codecs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/mix.h"

namespace pserver {

CodecPlan CodecPlan::ForSlice(const std::vector<TensorSlot>& slots,
                              ShardRange range,
                              const std::vector<const Codec*>& codecs) {
  CodecPlan plan;
  bool any = false;
  for (size_t i = 0; i < slots.size(); ++i) {
    const uint64_t b = std::max(slots[i].offset, range.begin);
    const uint64_t e = std::min(slots[i].offset + slots[i].size, range.end);
    if (b >= e) continue;
    any |= codecs[i] != nullptr;
    const CodecPiece piece{b - range.begin, e - range.begin, codecs[i]};
    if (!plan.pieces_.empty() && plan.pieces_.back().codec == piece.codec) {
      plan.pieces_.back().end = piece.end;
    } else {
      plan.pieces_.push_back(piece);
    }
  }
  if (!any) plan.pieces_.clear();
  return plan;
}

void CodecPlan::Cut(uint64_t offset, uint64_t n,
                    std::vector<CodecPiece>* out) const {
  out->clear();
  const uint64_t end = offset + n;
  if (pieces_.empty()) {
    out->push_back(CodecPiece{offset, end, nullptr});
    return;
  }
  // The first piece that ends after offset.
  auto it = std::upper_bound(
      pieces_.begin(), pieces_.end(), offset,
      [](uint64_t o, const CodecPiece& p) { return o < p.end; });
  for (; it != pieces_.end() && it->begin < end; ++it) {
    out->push_back(CodecPiece{std::max(it->begin, offset),
                              std::min(it->end, end), it->codec});
  }
  if (out->empty()) out->push_back(CodecPiece{offset, end, nullptr});
}

bool CodecPlan::AnyLossy(const Codec& stream) const {
  if (pieces_.empty()) return stream.id() != v1::CODEC_FP32;
  for (const CodecPiece& p : pieces_) {
    const Codec& c = p.codec != nullptr ? *p.codec : stream;
    if (c.id() != v1::CODEC_FP32) return true;
  }
  return false;
}

namespace {

absl::Status EncodePiece(const Codec& codec, ErrorFeedback* ef,
                         uint64_t offset, absl::Span<const float> u,
                         uint64_t seed, v1::EncodedTensor* out) {
  return ef != nullptr ? ef->EncodeAtWith(codec, offset, u, seed, out)
                       : codec.Encode(u, seed, out);
}

}  // namespace

absl::Status EncodeWithPlan(const CodecPlan& plan, const Codec& stream,
                            ErrorFeedback* ef, uint64_t offset,
                            absl::Span<const float> u, uint64_t seed,
                            v1::EncodedTensor* out) {
  thread_local std::vector<CodecPiece> pieces;
  plan.Cut(offset, u.size(), &pieces);
  if (pieces.size() == 1) {
    const Codec& c = pieces[0].codec != nullptr ? *pieces[0].codec : stream;
    return EncodePiece(c, ef, offset, u, seed, out);
  }
  uint64_t covered = 0;
  for (const CodecPiece& p : pieces) covered += p.end - p.begin;
  if (covered != u.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "span [", offset, ", ", offset + u.size(),
        ") is not inside the plan's slice"));
  }
  // All or nothing: a non-finite value is refused before any piece's
  // residual moves.
  if (absl::Status s = CheckAllFinite(u, "input"); !s.ok()) return s;
  out->Clear();
  out->set_codec(v1::CODEC_SEGMENTS);
  out->set_num_elements(u.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const CodecPiece& p = pieces[i];
    const Codec& c = p.codec != nullptr ? *p.codec : stream;
    absl::Status s =
        EncodePiece(c, ef, p.begin, u.subspan(p.begin - offset, p.end - p.begin),
                    MixPair(seed, i), out->add_segments());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pserver
