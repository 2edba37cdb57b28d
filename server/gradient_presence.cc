#include "server/gradient_presence.h"

#include <algorithm>

namespace pserver {

void GradientPresence::Reset(const std::vector<LocalSegment>& segments) {
  ends_.clear();
  buffer_.clear();
  for (const LocalSegment& s : segments) {
    ends_.push_back(s.end);
    buffer_.push_back(s.buffer);
  }
  Clear();
}

void GradientPresence::Clear() {
  marked_.assign(ends_.size(), false);
  unmarked_ = 0;
  for (bool b : buffer_) unmarked_ += b ? 0 : 1;
  overflow_ = false;
}

void GradientPresence::MarkOverflow(uint32_t w) {
  if (!overflow_) overflow_worker_ = w;
  overflow_ = true;
}

void GradientPresence::MarkRange(uint64_t begin, uint64_t end) {
  // The first segment that ends after `begin`.
  auto it = std::upper_bound(ends_.begin(), ends_.end(), begin);
  for (size_t i = it - ends_.begin(); i < ends_.size(); ++i) {
    if (i > 0 && ends_[i - 1] >= end) break;  // starts at or after `end`
    if (!marked_[i]) {
      marked_[i] = true;
      if (!buffer_[i]) --unmarked_;
    }
  }
}

void GradientPresence::Mark(uint64_t offset, const v1::EncodedTensor& t) {
  if (unmarked_ == 0) return;
  if (t.codec() != v1::CODEC_SEGMENTS) {
    if (t.codec() != v1::CODEC_NO_GRADIENT && t.num_elements() > 0) {
      MarkRange(offset, offset + t.num_elements());
    }
    return;
  }
  uint64_t at = offset;
  for (const v1::EncodedTensor& piece : t.segments()) {
    if (piece.codec() != v1::CODEC_NO_GRADIENT && piece.num_elements() > 0) {
      MarkRange(at, at + piece.num_elements());
    }
    at += piece.num_elements();
  }
}

std::vector<bool> GradientPresence::Skipped() const {
  if (unmarked_ == 0 && !overflow_) return {};
  std::vector<bool> skip(ends_.size(), false);
  for (size_t i = 0; i < ends_.size(); ++i) {
    skip[i] = (overflow_ || !marked_[i]) && !buffer_[i];
  }
  return skip;
}

}  // namespace pserver
