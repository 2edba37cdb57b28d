#include "common/tensor_codecs.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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
    plan.tensors_.push_back(
        Span{b - range.begin, e - range.begin,
             static_cast<int64_t>(slots[i].offset) -
                 static_cast<int64_t>(range.begin),
             slots[i].row_length});
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

CodecPlan CodecPlan::WithoutGradient(
    absl::Span<const std::pair<uint64_t, uint64_t>> absent) const {
  if (absent.empty()) return *this;
  CodecPlan plan;
  plan.tensors_ = tensors_;
  // A uniform plan is one piece of the stream's codec over everything.
  const std::vector<CodecPiece> whole{
      CodecPiece{0, UINT64_MAX, nullptr}};
  const std::vector<CodecPiece>& base = pieces_.empty() ? whole : pieces_;
  const Codec* const none = NoGradientMarker();
  auto add = [&](uint64_t b, uint64_t e, const Codec* c) {
    if (b >= e) return;
    if (!plan.pieces_.empty() && plan.pieces_.back().codec == c &&
        plan.pieces_.back().end == b) {
      plan.pieces_.back().end = e;
    } else {
      plan.pieces_.push_back(CodecPiece{b, e, c});
    }
  };
  size_t r = 0;
  for (const CodecPiece& p : base) {
    uint64_t at = p.begin;
    while (r < absent.size() && absent[r].second <= at) ++r;
    for (size_t k = r; k < absent.size() && absent[k].first < p.end; ++k) {
      const uint64_t b = std::max(absent[k].first, at);
      const uint64_t e = std::min(absent[k].second, p.end);
      add(at, b, p.codec);
      add(b, e, none);
      at = e;
    }
    add(at, p.end, p.codec);
  }
  return plan;
}

const Codec* NoGradientMarker() { return DecoderFor(v1::CODEC_NO_GRADIENT); }

const Codec* BlockTopKWithRows(const Codec& base, uint64_t rows) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* const cache =
      new absl::flat_hash_map<std::string, std::unique_ptr<Codec>>();
  v1::CodecParams p = base.params();
  p.set_row_length(rows);
  const std::string key = p.SerializeAsString();
  absl::MutexLock lock(&mu);
  auto it = cache->find(key);
  if (it == cache->end()) {
    absl::StatusOr<std::unique_ptr<Codec>> c =
        MakeCodec(v1::CODEC_BLOCK_TOPK, p);
    if (!c.ok()) return &base;
    it = cache->emplace(key, *std::move(c)).first;
  }
  return it->second.get();
}

std::vector<const Codec*> WithExactBuffers(
    const std::vector<TensorSlot>& slots, std::vector<const Codec*> codecs) {
  for (size_t i = 0; i < slots.size() && i < codecs.size(); ++i) {
    // fp32 has no parameters: the shared default instance is the codec.
    if (slots[i].buffer) codecs[i] = DecoderFor(v1::CODEC_FP32);
  }
  return codecs;
}

void CodecPlan::CutForBlocks(uint64_t b, uint64_t e, const Codec& c,
                             std::vector<CodecPiece>* out) const {
  auto add = [&](uint64_t from, uint64_t to, const Codec* codec) {
    if (!out->empty() && out->back().codec == codec &&
        out->back().end == from) {
      out->back().end = to;  // same codec, next to each other
    } else {
      out->push_back(CodecPiece{from, to, codec});
    }
  };
  uint64_t at = b;
  for (const Span& t : tensors_) {
    if (t.end <= at) continue;
    if (t.begin >= e) break;
    const uint64_t from = std::max(t.begin, at);
    const uint64_t to = std::min(t.end, e);
    // The whole rows of the piece take the rows' codec; a partial row at
    // either end (a shard or chunk boundary inside a row) runs flat.
    const uint64_t r = t.row_length;
    uint64_t body_begin = to, body_end = to;
    if (r > 1) {
      const uint64_t into =
          static_cast<uint64_t>(static_cast<int64_t>(from) - t.first);
      body_begin = std::min(to, from + (r - into % r) % r);
      body_end = body_begin + (to - body_begin) / r * r;
    }
    if (body_end > body_begin) {
      if (body_begin > from) add(from, body_begin, &c);
      add(body_begin, body_end, BlockTopKWithRows(c, r));
      if (to > body_end) add(body_end, to, &c);
    } else {
      add(from, to, &c);
    }
    at = to;
  }
  if (at < e) add(at, e, &c);  // beyond the tensors: refused by the caller
}

namespace {

absl::Status EncodePiece(const Codec& codec, ErrorFeedback* ef,
                         uint64_t offset, absl::Span<const float> u,
                         uint64_t seed, v1::EncodedTensor* out, double bound) {
  if (codec.id() == v1::CODEC_NO_GRADIENT) {
    out->Clear();
    out->set_codec(v1::CODEC_NO_GRADIENT);
    out->set_num_elements(u.size());
    return absl::OkStatus();
  }
  return ef != nullptr ? ef->EncodeAtWith(codec, offset, u, seed, out, bound)
                       : codec.Encode(u, seed, out);
}

}  // namespace

absl::Status EncodeWithPlan(const CodecPlan& plan, const Codec& stream,
                            ErrorFeedback* ef, uint64_t offset,
                            absl::Span<const float> u, uint64_t seed,
                            v1::EncodedTensor* out, double bound) {
  thread_local std::vector<CodecPiece> cut;
  // The pieces with their codecs resolved (never nullptr).
  thread_local std::vector<CodecPiece> pieces;
  plan.Cut(offset, u.size(), &cut);
  pieces.clear();
  for (const CodecPiece& p : cut) {
    const Codec& c = p.codec != nullptr ? *p.codec : stream;
    if (c.id() == v1::CODEC_BLOCK_TOPK && c.params().row_length() == 0 &&
        !plan.tensors_.empty()) {
      plan.CutForBlocks(p.begin, p.end, c, &pieces);
    } else {
      pieces.push_back(CodecPiece{p.begin, p.end, &c});
    }
  }
  if (pieces.size() == 1) {
    // `out` may be a reused request's, CODEC_SEGMENTS last time (a step
    // with tensors without a gradient); a codec writes only its own fields.
    out->clear_segments();
    return EncodePiece(*pieces[0].codec, ef, offset, u, seed, out, bound);
  }
  uint64_t covered = 0;
  for (const CodecPiece& p : pieces) covered += p.end - p.begin;
  if (covered != u.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "span [", offset, ", ", offset + u.size(),
        ") is not inside the plan's slice"));
  }
  // All or nothing: a non-finite value is refused before any piece's
  // residual moves (a finite bound says there is none).
  if (!(bound >= 0.0 && std::isfinite(bound))) {
    if (absl::Status s = CheckAllFinite(u, "input"); !s.ok()) return s;
  }
  out->Clear();
  out->set_codec(v1::CODEC_SEGMENTS);
  out->set_num_elements(u.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const CodecPiece& p = pieces[i];
    absl::Status s = EncodePiece(
        *p.codec, ef, p.begin,
        u.subspan(p.begin - offset, p.end - p.begin), MixPair(seed, i),
        out->add_segments(), bound);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pserver
