// Per-tensor codecs over one shard's slice: a schedule phase may give the
// model's tensors codecs of their own (SchedulePhase.tensors, written by
// pserver_tune). A CodecPlan says which codec each range of the slice takes;
// EncodeWithPlan encodes one chunk of the slice by it: a chunk inside one
// tensor range is a plain tensor of that codec, a chunk holding pieces of
// tensors with different codecs becomes CODEC_SEGMENTS (codec.proto), one
// segment per piece. Every decoder (ValidateTensor, DecoderFor) decodes
// both, so the shard's sums and the workers' replicas need nothing else.
//
// block_topk keeps its blocks inside the rows of a tensor's last dimension
// where the shape allows (codec.proto, row_length): a chunk encoded with
// block_topk is cut at tensor boundaries, and the whole rows of each piece
// are encoded with that row length; vectors, and a partial row at either
// end of a piece (a shard or chunk boundary inside a row), run their blocks
// over the flat span. Other codecs are never cut at tensors
// unless the plan gives tensors codecs of their own.
//
//   CodecPlan plan = CodecPlan::ForSlice(slots, range,
//                                        schedule.TensorPushCodecs(phase, slots));
//   EncodeWithPlan(plan, ef.codec(), &ef, chunk_begin, chunk, seed, &out);
#ifndef PSERVER_COMMON_TENSOR_CODECS_H_
#define PSERVER_COMMON_TENSOR_CODECS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/layout.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

// Slice elements [begin, end) encoded with `codec`; nullptr: the stream's
// own codec (the phase's or the daemon's).
struct CodecPiece {
  uint64_t begin = 0;
  uint64_t end = 0;
  const Codec* codec = nullptr;
};

// Immutable after construction; copyable. The codecs are borrowed (the
// schedule owns them) and must outlive the plan's use.
class CodecPlan {
 public:
  // One codec over the whole slice, no tensor boundaries known (block_topk
  // runs over the flat span).
  CodecPlan() = default;
  // The plan of the slice `range` of a model whose tensors lie at `slots`,
  // tensor i taking codecs[i] (nullptr: the stream's codec). Neighbouring
  // tensors with the same codec form one piece. The tensors' places and
  // rows are kept for block_topk whatever the codecs.
  // REQUIRES: codecs.size() == slots.size().
  static CodecPlan ForSlice(const std::vector<TensorSlot>& slots,
                            ShardRange range,
                            const std::vector<const Codec*>& codecs);

  // No tensor of the slice has a codec of its own.
  bool uniform() const { return pieces_.empty(); }
  // This plan with the slice ranges `absent` (sorted, disjoint [begin, end)
  // pairs: the parameter tensors without a gradient this step) taking
  // NoGradientMarker(): EncodeWithPlan sends them as CODEC_NO_GRADIENT.
  CodecPlan WithoutGradient(
      absl::Span<const std::pair<uint64_t, uint64_t>> absent) const;
  // The pieces of slice elements [offset, offset + n), clipped to it, in
  // order; one piece when uniform() (codec nullptr) or the span lies in one.
  void Cut(uint64_t offset, uint64_t n, std::vector<CodecPiece>* out) const;

 private:
  friend absl::Status EncodeWithPlan(const CodecPlan&, const Codec&,
                                     ErrorFeedback*, uint64_t,
                                     absl::Span<const float>, uint64_t,
                                     v1::EncodedTensor*, double);
  // A tensor's part of the slice, in slice coordinates; `first` is the
  // slice coordinate of the tensor's first element (negative when the
  // tensor begins in an earlier shard).
  struct Span {
    uint64_t begin = 0;
    uint64_t end = 0;
    int64_t first = 0;
    uint64_t row_length = 0;
  };
  // Appends the pieces of [b, e) (one codec `c`, block_topk) cut at tensor
  // boundaries, the whole rows of each with its row-aware codec (every
  // piece's codec set).
  void CutForBlocks(uint64_t b, uint64_t e, const Codec& c,
                    std::vector<CodecPiece>* out) const;

  std::vector<CodecPiece> pieces_;  // cover the slice; empty when uniform
  std::vector<Span> tensors_;       // the slice's tensors, in order
};

// `base` (a block_topk codec without a row length) with row_length `rows`:
// one shared instance per parameters and row length, alive until the
// process exits. `base` itself when that codec cannot be built.
const Codec* BlockTopKWithRows(const Codec& base, uint64_t rows);

// The codec a plan's piece takes for a span without a gradient
// (CodecPlan::WithoutGradient): EncodeWithPlan sends the piece as
// CODEC_NO_GRADIENT, with no values, and leaves its residual as it was (a
// tensor's error feedback waits for its next gradient, as torch.optim
// leaves a parameter without one untouched).
const Codec* NoGradientMarker();

// `codecs` (one per slot, as CodecPlan::ForSlice takes them) with fp32 for
// every buffer tensor (TensorSlot::buffer): buffers travel exactly whatever
// the stream's or a schedule's codec.
std::vector<const Codec*> WithExactBuffers(
    const std::vector<TensorSlot>& slots, std::vector<const Codec*> codecs);

// Encodes slice elements [offset, offset + u.size()) by `plan` into *out:
// nullptr pieces take `stream`. One piece: a plain tensor of its codec, with
// `seed`. Several: CODEC_SEGMENTS, piece i encoded with MixPair(seed, i).
// NoGradientMarker() pieces become CODEC_NO_GRADIENT, their values unread.
// With `ef`, each piece goes through ef->EncodeAtWith (error feedback on
// that piece of the residual); without, through the codec's Encode.
// INVALID_ARGUMENT for a non-finite input (checked before any piece is
// encoded, so the residual is unchanged) or a piece the codec refuses.
// `bound`: an upper bound of every |u[i]| the caller knows, or negative
// (ErrorFeedback::EncodeAt's; a finite one also stands for the finite check).
absl::Status EncodeWithPlan(const CodecPlan& plan, const Codec& stream,
                            ErrorFeedback* ef, uint64_t offset,
                            absl::Span<const float> u, uint64_t seed,
                            v1::EncodedTensor* out, double bound = -1.0);

}  // namespace pserver

#endif  // PSERVER_COMMON_TENSOR_CODECS_H_
