// Plumbing shared by all codecs: header checks, finiteness, value formats.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/impl/wire_scalar.h"
#include "common/internal/float16.h"

namespace pserver {
namespace impl {

absl::Status CodecBase::DecodeAccumulate(const v1::EncodedTensor& t,
                                         float alpha,
                                         absl::Span<float> acc) const {
  absl::Status s = Validate(t, acc.size());
  if (!s.ok()) return s;
  AccumulateValid(t, alpha, acc);
  return absl::OkStatus();
}

absl::Status CodecBase::CheckHeader(const v1::EncodedTensor& t,
                                    uint64_t n) const {
  if (t.codec() != id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec is ", CodecName(t.codec()), "; expected ",
                     CodecName(id_)));
  }
  if (t.num_elements() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_elements is ", t.num_elements(), "; expected ", n));
  }
  if (id_ != v1::CODEC_SEGMENTS && t.segments_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segments holds ", t.segments_size(), " tensors for codec ",
        CodecName(t.codec()), "; expected none (only segments has them)"));
  }
  return absl::OkStatus();
}

void CodecBase::StartOutput(uint64_t n, v1::EncodedTensor* out) const {
  out->set_codec(id_);
  out->set_num_elements(n);
  *out->mutable_params() = params_;
  out->clear_payload();
}

absl::Status NonFiniteInput(uint64_t index, float value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "input element ", index, " is ", std::isnan(value) ? "NaN" : "Inf",
      "; expected finite values"));
}

absl::Status CheckFinite(absl::Span<const float> u) {
  // Branch-free in chunks; pinpoint the index only on failure.
  constexpr size_t kChunk = 1024;
  for (size_t b = 0; b < u.size(); b += kChunk) {
    size_t e = std::min(u.size(), b + kChunk);
    uint32_t bad = 0;
    for (size_t i = b; i < e; ++i) {
      bad |= (internal::FloatBits(u[i]) & 0x7f800000) == 0x7f800000;
    }
    if (bad) {
      for (size_t i = b; i < e; ++i) {
        if (!std::isfinite(u[i])) return NonFiniteInput(i, u[i]);
      }
    }
  }
  return absl::OkStatus();
}

uint64_t ResolveK(const v1::CodecParams& p, uint64_t n) {
  if (n == 0) return 0;
  uint64_t k = p.k();
  if (k == 0) {
    double want = std::nearbyint(p.k_fraction() * static_cast<double>(n));
    k = want < 1.0 ? 1 : static_cast<uint64_t>(want);
  }
  return k > n ? n : k;
}

size_t ValueBytes(v1::ValueFormat f) {
  return f == v1::VALUE_FORMAT_FP16 ? kScalarBytes<Scalar::kFp16>
                                    : kScalarBytes<Scalar::kFp32>;
}

void AppendValues(absl::Span<const float> v, v1::ValueFormat f,
                  std::string* out) {
  if (f == v1::VALUE_FORMAT_FP16) {
    AppendScalars<Scalar::kFp16>(v, out);
  } else {
    AppendScalars<Scalar::kFp32>(v, out);
  }
}

float LoadValue(const uint8_t* p, v1::ValueFormat f) {
  return f == v1::VALUE_FORMAT_FP16 ? LoadScalar<Scalar::kFp16>(p)
                                    : LoadScalar<Scalar::kFp32>(p);
}

absl::Status CheckValues(const uint8_t* p, uint64_t count, v1::ValueFormat f,
                         absl::string_view what) {
  const uint64_t bad = f == v1::VALUE_FORMAT_FP16
                           ? FirstNonFiniteScalar<Scalar::kFp16>(p, count)
                           : FirstNonFiniteScalar<Scalar::kFp32>(p, count);
  if (bad < count) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " value ", bad, " is not finite; expected finite values"));
  }
  return absl::OkStatus();
}

absl::Status CheckValueFormat(const v1::CodecParams& p) {
  switch (p.value_format()) {
    case v1::VALUE_FORMAT_UNSPECIFIED:
    case v1::VALUE_FORMAT_FP32:
    case v1::VALUE_FORMAT_FP16:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("params.value_format is ", p.value_format(),
                       "; expected VALUE_FORMAT_FP32 or VALUE_FORMAT_FP16"));
  }
}

}  // namespace impl
}  // namespace pserver
