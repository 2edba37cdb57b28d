// fp32, fp16 and bf16: raw little-endian values, one per element. fp16 and
// bf16 round to nearest even and saturate at their largest finite value.
#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/impl/wire_scalar.h"

namespace pserver {
namespace impl {
namespace {

template <Scalar S>
class FloatCodec final : public CodecBase {
 public:
  FloatCodec(v1::Codec id, const v1::CodecParams& params)
      : CodecBase(id, params) {}

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    absl::Status s = CheckFinite(u);
    if (!s.ok()) return s;
    StartOutput(u.size(), out);
    AppendScalars<S>(u, out->mutable_payload());
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    constexpr size_t kWidth = kScalarBytes<S>;
    const std::string& payload = t.payload();
    unsigned __int128 want = static_cast<unsigned __int128>(n) * kWidth;
    if (payload.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload is ", payload.size(), " bytes; expected ", n * kWidth,
          " for ", n, " ", CodecName(id()), " elements"));
    }
    const uint64_t bad = FirstNonFiniteScalar<S>(
        reinterpret_cast<const uint8_t*>(payload.data()), n);
    if (bad < n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload element ", bad, " is not finite; expected finite values"));
    }
    return absl::OkStatus();
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    AccumulateScalars<S>(reinterpret_cast<const uint8_t*>(t.payload().data()),
                         acc.size(), alpha, acc.data());
  }
};

}  // namespace

std::unique_ptr<Codec> NewFloatCodec(v1::Codec id,
                                     const v1::CodecParams& params) {
  switch (id) {
    case v1::CODEC_FP32:
      return std::make_unique<FloatCodec<Scalar::kFp32>>(id, params);
    case v1::CODEC_FP16:
      return std::make_unique<FloatCodec<Scalar::kFp16>>(id, params);
    default:
      return std::make_unique<FloatCodec<Scalar::kBf16>>(id, params);
  }
}

}  // namespace impl
}  // namespace pserver
