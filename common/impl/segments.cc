// CODEC_SEGMENTS (codec.proto): consecutive spans, each an encoded tensor of
// its own codec. Only a decoder: segmented tensors are built by
// EncodeWithPlan (common/tensor_codecs.h), which knows where a span lies in
// the model and so which tensor's codec each piece takes.
#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/validated_tensor.h"

namespace pserver {
namespace impl {

class SegmentsCodec final : public CodecBase {
 public:
  SegmentsCodec() : CodecBase(v1::CODEC_SEGMENTS, v1::CodecParams()) {}

  absl::Status Encode(absl::Span<const float>, uint64_t,
                      v1::EncodedTensor*) const override {
    return absl::FailedPreconditionError(
        "segments are not a codec to encode with; per-tensor codecs encode "
        "through EncodeWithPlan (common/tensor_codecs.h)");
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t num_elements) const override {
    if (absl::Status s = CheckHeader(t, num_elements); !s.ok()) return s;
    if (t.has_params() && t.params().ByteSizeLong() > 0) {
      return absl::InvalidArgumentError(
          "params is set; expected none for segments (each segment carries "
          "its own)");
    }
    if (!t.payload().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("payload holds ", t.payload().size(),
                       " bytes; expected none for segments (the segments "
                       "hold the values)"));
    }
    if (t.segments_size() < 1 || t.segments_size() > kMaxSegments) {
      return absl::InvalidArgumentError(
          absl::StrCat("segments holds ", t.segments_size(),
                       " tensors; expected 1..", kMaxSegments));
    }
    // The lengths first (cheap), so a wrong total is reported before any
    // segment's payload is read.
    uint64_t total = 0;
    for (int i = 0; i < t.segments_size(); ++i) {
      const v1::EncodedTensor& s = t.segments(i);
      if (s.codec() == v1::CODEC_SEGMENTS) {
        return absl::InvalidArgumentError(absl::StrCat(
            "segments[", i, "].codec is segments; expected a codec that "
            "holds values (segments do not nest)"));
      }
      if (s.num_elements() == 0 ||
          s.num_elements() > num_elements - total) {
        return absl::InvalidArgumentError(absl::StrCat(
            "segments[", i, "].num_elements is ", s.num_elements(),
            "; expected 1..", num_elements - total,
            " (the segments' lengths add up to num_elements ", num_elements,
            ")"));
      }
      total += s.num_elements();
    }
    if (total != num_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("segments cover ", total, " elements; expected ",
                       num_elements, " (num_elements)"));
    }
    for (int i = 0; i < t.segments_size(); ++i) {
      const v1::EncodedTensor& s = t.segments(i);
      absl::StatusOr<ValidatedTensor> v = ValidateTensor(s, s.num_elements());
      if (!v.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("segments[", i, "].", v.status().message()));
      }
    }
    return absl::OkStatus();
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    ForEachSegment(t, [&](const Codec* d, const v1::EncodedTensor& s,
                          uint64_t offset, uint64_t n) {
      d->AccumulateValid(s, alpha, acc.subspan(offset, n));
    });
  }
  void AddValid(const v1::EncodedTensor& t, absl::Span<const float> base,
                absl::Span<float> out) const override {
    ForEachSegment(t, [&](const Codec* d, const v1::EncodedTensor& s,
                          uint64_t offset, uint64_t n) {
      d->AddValid(s, base.subspan(offset, n), out.subspan(offset, n));
    });
  }
  void AssignValid(const v1::EncodedTensor& t, float alpha,
                   absl::Span<float> out) const override {
    ForEachSegment(t, [&](const Codec* d, const v1::EncodedTensor& s,
                          uint64_t offset, uint64_t n) {
      d->AssignValid(s, alpha, out.subspan(offset, n));
    });
  }

 private:
  // fn(decoder, segment, offset, n) for each segment in order, offset its
  // first element in the whole tensor. Validated: every segment's codec is
  // known.
  template <typename Fn>
  static void ForEachSegment(const v1::EncodedTensor& t, Fn fn) {
    uint64_t offset = 0;
    for (const v1::EncodedTensor& s : t.segments()) {
      fn(DecoderFor(s.codec()), s, offset, s.num_elements());
      offset += s.num_elements();
    }
  }
};

std::unique_ptr<Codec> NewSegmentsDecoder() {
  return std::make_unique<SegmentsCodec>();
}

}  // namespace impl
}  // namespace pserver
