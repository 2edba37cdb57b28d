// CODEC_UNCHANGED and CODEC_NO_GRADIENT (codec.proto): spans sent as
// nothing. Only decoders, which know no receiver: both decode to zeros.
// Unchanged is what the receiver holds already: zeros are its meaning in a
// pull delta, and the shard gives it its push meaning (its replica's values
// of buffers) before summing a push. No gradient is a worker's parameters
// without a gradient this step: zeros in the round's sum, and the shard
// skips a tensor no push of the round had a gradient for.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"

namespace pserver {
namespace impl {

class EmptySpanCodec final : public CodecBase {
 public:
  EmptySpanCodec(v1::Codec codec, const char* name, const char* how)
      : CodecBase(codec, v1::CodecParams()), name_(name), how_(how) {}

  absl::Status Encode(absl::Span<const float>, uint64_t,
                      v1::EncodedTensor*) const override {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, " is not a codec to encode with; ", how_));
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t num_elements) const override {
    if (absl::Status s = CheckHeader(t, num_elements); !s.ok()) return s;
    if (t.has_params() && t.params().ByteSizeLong() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("params is set; expected none for ", name_));
    }
    if (!t.payload().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("payload holds ", t.payload().size(),
                       " bytes; expected none for ", name_));
    }
    return absl::OkStatus();
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor&, float,
                       absl::Span<float>) const override {}
  void AddValid(const v1::EncodedTensor&, absl::Span<const float> base,
                absl::Span<float> out) const override {
    if (base.data() != out.data()) {
      std::copy(base.begin(), base.end(), out.begin());
    }
  }
  void AssignValid(const v1::EncodedTensor&, float,
                   absl::Span<float> out) const override {
    std::fill(out.begin(), out.end(), 0.0f);
  }

 private:
  const char* const name_;
  const char* const how_;
};

std::unique_ptr<Codec> NewUnchangedDecoder() {
  return std::make_unique<EmptySpanCodec>(
      v1::CODEC_UNCHANGED, "unchanged",
      "a sender marks an fp32 span it knows the receiver holds "
      "(common/unchanged.h MarkUnchanged)");
}

std::unique_ptr<Codec> NewNoGradientDecoder() {
  return std::make_unique<EmptySpanCodec>(
      v1::CODEC_NO_GRADIENT, "no_gradient",
      "a worker's plan marks the tensors without a gradient "
      "(common/tensor_codecs.h CodecPlan::WithoutGradient)");
}

}  // namespace impl
}  // namespace pserver
