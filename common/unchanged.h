// The pieces of an encoded span that a sender leaves out because the
// receiver holds them already (CODEC_UNCHANGED, codec.proto): a worker's
// buffer values that equal its replica, a pull delta's buffer pieces that
// are zero. Constant buffers (a causal mask registered as a persistent
// buffer) then cost nothing per step.
//
// Pieces are the tensor itself or, for CODEC_SEGMENTS, each segment; only
// fp32 pieces are ever marked (buffers travel in fp32: WithExactBuffers).
// Ranges are sorted, disjoint [begin, end) pairs in slice coordinates, and
// a tensor encodes slice elements [offset, offset + num_elements).
#ifndef PSERVER_COMMON_UNCHANGED_H_
#define PSERVER_COMMON_UNCHANGED_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/layout.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

using ElementRanges = std::vector<std::pair<uint64_t, uint64_t>>;

// The slice-local ranges of the buffer tensors (TensorSlot::buffer) inside
// `range`, one per tensor.
ElementRanges BufferRanges(const std::vector<TensorSlot>& slots,
                           ShardRange range);

// Every fp32 piece of *t that lies in `ranges` (one per buffer tensor) is
// looked at tensor by tensor: the tensors for which `same(begin, bytes)`
// holds (begin: the tensor's first slice element in the piece; bytes: its
// fp32 values there) become CODEC_UNCHANGED, with no payload. A piece whose
// tensors differ in that is cut into segments where they do (t becomes
// CODEC_SEGMENTS if it was not), unless that would make more than a
// tensor's 4096 segments: then only pieces whose tensors are all the same
// are marked. Returns the elements marked.
uint64_t MarkUnchanged(
    v1::EncodedTensor* t, uint64_t offset, absl::Span<const ElementRanges::value_type> ranges,
    absl::FunctionRef<bool(uint64_t begin, absl::string_view fp32)> same);

// Whether every value of an fp32 payload is zero (+0 or -0): a delta that
// changes nothing.
bool AllZero(absl::string_view fp32);

// Whether t or one of its segments is CODEC_UNCHANGED.
bool HasUnchanged(const v1::EncodedTensor& t);

// The first CODEC_UNCHANGED piece of t not inside one of `ranges`: its
// segment index (-1: t itself) and its first slice element outside them;
// nothing when every such piece is inside.
struct OutsidePiece {
  int segment = -1;
  uint64_t element = 0;
};
std::optional<OutsidePiece> UnchangedOutside(
    const v1::EncodedTensor& t, uint64_t offset,
    absl::Span<const ElementRanges::value_type> ranges);

// The first CODEC_NO_GRADIENT piece of t that overlaps one of `ranges` (the
// buffers, which have no gradient to leave out): its segment index (-1: t
// itself) and the first slice element of the overlap; nothing when none.
std::optional<OutsidePiece> NoGradientOver(
    const v1::EncodedTensor& t, uint64_t offset,
    absl::Span<const ElementRanges::value_type> ranges);

// Every CODEC_UNCHANGED piece of *t becomes CODEC_FP32 holding its values
// from `values` (t's elements, values.size() == t->num_elements()): what
// the sender would have sent.
void FillUnchanged(v1::EncodedTensor* t, absl::Span<const float> values);

}  // namespace pserver

#endif  // PSERVER_COMMON_UNCHANGED_H_
