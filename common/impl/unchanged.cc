// CODEC_UNCHANGED (codec.proto): a span sent as nothing because the receiver
// holds it already. Only a decoder, which knows no receiver: it decodes to
// zeros, what the span means in a pull delta. The shard gives it its push
// meaning (its replica's values of buffers) before summing a push.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"

namespace pserver {
namespace impl {

class UnchangedCodec final : public CodecBase {
 public:
  UnchangedCodec() : CodecBase(v1::CODEC_UNCHANGED, v1::CodecParams()) {}

  absl::Status Encode(absl::Span<const float>, uint64_t,
                      v1::EncodedTensor*) const override {
    return absl::FailedPreconditionError(
        "unchanged is not a codec to encode with; a sender marks an fp32 "
        "span it knows the receiver holds (common/tensor_codecs.h "
        "MarkUnchanged)");
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t num_elements) const override {
    if (absl::Status s = CheckHeader(t, num_elements); !s.ok()) return s;
    if (t.has_params() && t.params().ByteSizeLong() > 0) {
      return absl::InvalidArgumentError(
          "params is set; expected none for unchanged");
    }
    if (!t.payload().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("payload holds ", t.payload().size(),
                       " bytes; expected none for unchanged"));
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
};

std::unique_ptr<Codec> NewUnchangedDecoder() {
  return std::make_unique<UnchangedCodec>();
}

}  // namespace impl
}  // namespace pserver
