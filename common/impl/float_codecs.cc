// fp32, fp16 and bf16: raw little-endian values, one per element. fp16 and
// bf16 round to nearest even and saturate at their largest finite value.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/internal/float16.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "payloads are little-endian; add byte swaps for this target");

namespace pserver {
namespace impl {
namespace {

class FloatCodec final : public CodecBase {
 public:
  FloatCodec(v1::Codec id, const v1::CodecParams& params)
      : CodecBase(id, params), width_(id == v1::CODEC_FP32 ? 4 : 2) {}

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    absl::Status s = CheckFinite(u);
    if (!s.ok()) return s;
    StartOutput(u.size(), out);
    std::string* payload = out->mutable_payload();
    payload->resize(u.size() * width_);
    char* p = payload->data();
    switch (id()) {
      case v1::CODEC_FP32:
        if (!u.empty()) std::memcpy(p, u.data(), u.size() * 4);
        break;
      case v1::CODEC_FP16:
        for (size_t i = 0; i < u.size(); ++i) {
          uint16_t h = internal::FloatToHalf(u[i]);
          std::memcpy(p + 2 * i, &h, 2);
        }
        break;
      default:
        for (size_t i = 0; i < u.size(); ++i) {
          uint16_t h = internal::FloatToBf16(u[i]);
          std::memcpy(p + 2 * i, &h, 2);
        }
        break;
    }
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    const std::string& payload = t.payload();
    unsigned __int128 want = static_cast<unsigned __int128>(n) * width_;
    if (payload.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload is ", payload.size(), " bytes; expected ", n * width_,
          " for ", n, " ", CodecName(id()), " elements"));
    }
    const char* p = payload.data();
    for (uint64_t i = 0; i < n; ++i) {
      bool finite;
      if (width_ == 4) {
        uint32_t b;
        std::memcpy(&b, p + 4 * i, 4);
        finite = (b & 0x7f800000) != 0x7f800000;
      } else {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        finite = id() == v1::CODEC_FP16 ? internal::HalfIsFinite(h)
                                        : internal::Bf16IsFinite(h);
      }
      if (!finite) {
        return absl::InvalidArgumentError(absl::StrCat(
            "payload element ", i, " is not finite; expected finite values"));
      }
    }
    return absl::OkStatus();
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    const char* p = t.payload().data();
    float* a = acc.data();
    const size_t n = acc.size();
    switch (id()) {
      case v1::CODEC_FP32:
        for (size_t i = 0; i < n; ++i) {
          float v;
          std::memcpy(&v, p + 4 * i, 4);
          a[i] += alpha * v;
        }
        break;
      case v1::CODEC_FP16:
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          a[i] += alpha * internal::HalfToFloat(h);
        }
        break;
      default:
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          a[i] += alpha * internal::Bf16ToFloat(h);
        }
        break;
    }
  }

 private:
  const size_t width_;
};

}  // namespace

std::unique_ptr<Codec> NewFloatCodec(v1::Codec id,
                                     const v1::CodecParams& params) {
  return std::make_unique<FloatCodec>(id, params);
}

}  // namespace impl
}  // namespace pserver
