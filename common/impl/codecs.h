// Private to common/: the concrete codecs behind MakeCodec and DecoderFor,
// and the pieces that topk_quantize shares with topk and quantize.
//
// Decoders read the layout (block_size, value_format, bits, range, k, seed,
// row_length) from the tensor's own params, as codec.proto says, never from
// the codec object's configuration; the codec object only fixes the codec
// id. That is why DecoderFor can share one instance per id for every tensor.
#ifndef PSERVER_COMMON_IMPL_CODECS_H_
#define PSERVER_COMMON_IMPL_CODECS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/impl/scratch.h"
#include "common/internal/varint.h"

namespace pserver {
namespace impl {

// The most segments a CODEC_SEGMENTS tensor may hold (codec.proto).
inline constexpr int kMaxSegments = 4096;
// CODEC_SEGMENTS' decoder (segments.cc).
std::unique_ptr<Codec> NewSegmentsDecoder();
// CODEC_UNCHANGED's decoder (unchanged.cc).
std::unique_ptr<Codec> NewUnchangedDecoder();
// CODEC_NO_GRADIENT's decoder (unchanged.cc).
std::unique_ptr<Codec> NewNoGradientDecoder();

// Shared plumbing: header checks and DecodeAccumulate = Validate + kernel.
class CodecBase : public Codec {
 public:
  CodecBase(v1::Codec id, const v1::CodecParams& params)
      : id_(id), params_(params) {}

  v1::Codec id() const override { return id_; }
  const v1::CodecParams& params() const override { return params_; }

  absl::Status DecodeAccumulate(const v1::EncodedTensor& t, float alpha,
                                absl::Span<float> acc) const final;

 protected:
  // Codec id and element count of t against this codec and `n`; no
  // segments unless this is CODEC_SEGMENTS.
  absl::Status CheckHeader(const v1::EncodedTensor& t, uint64_t n) const;

  // Fills codec, num_elements and params of *out and clears its payload.
  void StartOutput(uint64_t n, v1::EncodedTensor* out) const;

 private:
  v1::Codec id_;
  v1::CodecParams params_;
};

// Checks every params field whatever the codec (unset fields stand for their
// defaults), so a typo in an unused field is still reported: INVALID_ARGUMENT
// "params.<field> is <value>; expected <range>". MakeCodec and ValidateTensor
// run it.
absl::Status CheckParams(const v1::CodecParams& p);

// INVALID_ARGUMENT naming the first non-finite element of u, or OK.
absl::Status CheckFinite(absl::Span<const float> u);
// The error for a non-finite u[index].
absl::Status NonFiniteInput(uint64_t index, float value);

// Block length for block_size `b` over n elements (0 = the whole tensor).
inline uint64_t EffectiveBlock(uint64_t n, uint32_t b) {
  if (b == 0 || b >= n) return n == 0 ? 1 : n;
  return b;
}
inline uint64_t CeilDiv(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

// k for topk/randomk: params.k if set, else max(1, round(k_fraction * n));
// never more than n; 0 for n == 0.
uint64_t ResolveK(const v1::CodecParams& p, uint64_t n);

// Values in a topk/randomk payload.
size_t ValueBytes(v1::ValueFormat f);  // 4 or 2
void AppendValues(absl::Span<const float> v, v1::ValueFormat f,
                  std::string* out);
// Checks `count` values at `p` (all finite). `what` names them in messages.
absl::Status CheckValues(const uint8_t* p, uint64_t count, v1::ValueFormat f,
                         absl::string_view what);
float LoadValue(const uint8_t* p, v1::ValueFormat f);  // REQUIRES: checked
absl::Status CheckValueFormat(const v1::CodecParams& p);

// ---- TopK indices (topk_indices.cc; writing: topk_select.h) ----
// Checks the varint count and gaps of a payload for n elements (count <= n,
// indices increasing and below n); on success sets *count and the offset of
// the first byte after the gaps.
// `unit` names what the indices count in messages ("num_elements" for
// element indices, "blocks" for block_topk).
absl::Status ParseIndices(absl::string_view payload, uint64_t n,
                          uint64_t* count, size_t* values_offset,
                          absl::string_view unit = "num_elements");

// Reads back the indices of a payload that ParseIndices accepted, without
// checks: validation happened once, before decoding.
class IndexWalker {
 public:
  // Reads the count. REQUIRES: ParseIndices accepted [p, end).
  IndexWalker(const uint8_t* p, const uint8_t* end) : p_(p), end_(end) {
    internal::GetVarint(&p_, end_, &count_);
  }
  uint64_t count() const { return count_; }
  // The first byte after the gaps. REQUIRES: Next() not called yet.
  const uint8_t* ValuesBegin() const {
    const uint8_t* q = p_;
    for (uint64_t j = 0; j < count_; ++j) {
      while (*q & 0x80) ++q;
      ++q;
    }
    return q;
  }
  // The next index. REQUIRES: called at most count() times.
  uint64_t Next() {
    uint64_t gap = 0;
    internal::GetVarint(&p_, end_, &gap);
    index_ = first_ ? gap : index_ + gap + 1;
    first_ = false;
    return index_;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  uint64_t count_ = 0;
  uint64_t index_ = 0;
  bool first_ = true;
};

// ---- Quantize core (quantize.cc), shared with topk_quantize ----
struct QuantizeSpec {
  uint32_t bits = 8;
  uint32_t block_size = 256;  // 0 = whole tensor
  bool adaptive = false;
  bool stochastic = false;
  float percentile = 99.0f;
};
// From tensor params (decoding) or codec params (encoding).
absl::Status QuantizeSpecFrom(const v1::CodecParams& p, QuantizeSpec* spec);
// Appends the quantize payload of u (finite). `seed` drives stochastic
// rounding of element i through Draw(StreamKey(seed), i). *block_mags is
// the adaptive range's workspace (one block of |u|).
void QuantizeAppend(absl::Span<const float> u, const QuantizeSpec& spec,
                    uint64_t seed, Buffer<float>* block_mags,
                    std::string* out);
// Checks that `payload` is exactly a quantize payload for n values.
absl::Status QuantizeCheck(absl::string_view payload, uint64_t n,
                           const QuantizeSpec& spec, absl::string_view what);
// acc[i] += alpha * decode(value i). REQUIRES: QuantizeCheck passed.
void QuantizeAccumulate(absl::string_view payload, uint64_t n,
                        const QuantizeSpec& spec, float alpha, float* acc);
// acc[at->Next()] += alpha * decode(value j) for the at->count() values in
// order (topk_quantize). REQUIRES: QuantizeCheck passed for at->count().
void QuantizeAccumulateAt(absl::string_view payload, const QuantizeSpec& spec,
                          float alpha, IndexWalker* at, float* acc);

// ---- Block TopK (block_topk.cc) ----
// block_size bounds of block_topk, and its default (a block of 16 fp32
// values costs one index of one or two bytes: under 4% overhead at fp32).
constexpr uint32_t kBlockTopKMinBlock = 4;
constexpr uint32_t kBlockTopKMaxBlock = 64;
constexpr uint32_t kBlockTopKDefaultBlock = 16;
// INVALID_ARGUMENT "params.block_size is <b>; expected 4..64 for
// block_topk" unless kBlockTopKMinBlock <= b <= kBlockTopKMaxBlock (or b is
// 0 and unset_ok: the encoder's default).
absl::Status CheckBlockTopKBlock(uint32_t b, bool unset_ok);

// ---- Constructors; params are complete and valid (MakeCodec checked) ----
std::unique_ptr<Codec> NewFloatCodec(v1::Codec id,
                                     const v1::CodecParams& params);
std::unique_ptr<Codec> NewOneBitCodec(const v1::CodecParams& params);
std::unique_ptr<Codec> NewTopKCodec(const v1::CodecParams& params);
std::unique_ptr<Codec> NewRandomKCodec(const v1::CodecParams& params);
std::unique_ptr<Codec> NewQuantizeCodec(const v1::CodecParams& params);
std::unique_ptr<Codec> NewTopKQuantizeCodec(const v1::CodecParams& params);
std::unique_ptr<Codec> NewBlockTopKCodec(const v1::CodecParams& params);

}  // namespace impl
}  // namespace pserver

#endif  // PSERVER_COMMON_IMPL_CODECS_H_
