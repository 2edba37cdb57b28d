#include "common/codec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/layout.h"

namespace pserver {
namespace {

struct NamedCodec {
  v1::Codec codec;
  const char* name;
};
constexpr NamedCodec kCodecs[] = {
    {v1::CODEC_FP32, "fp32"},       {v1::CODEC_FP16, "fp16"},
    {v1::CODEC_BF16, "bf16"},       {v1::CODEC_ONEBIT, "onebit"},
    {v1::CODEC_TOPK, "topk"},       {v1::CODEC_RANDOMK, "randomk"},
    {v1::CODEC_QUANTIZE, "quantize"},
    {v1::CODEC_TOPK_QUANTIZE, "topk_quantize"},
    {v1::CODEC_BLOCK_TOPK, "block_topk"},
};

std::string KnownCodecs() {
  std::string s;
  for (const NamedCodec& c : kCodecs) {
    if (!s.empty()) s += ", ";
    s += c.name;
  }
  return s;
}

absl::Status UnknownCodec(int codec) {
  return absl::InvalidArgumentError(absl::StrCat(
      "codec is ", codec, "; expected one of ", KnownCodecs()));
}

template <typename E>
absl::Status EnumIn(const char* field, int value, std::initializer_list<E> ok,
                    const char* expected) {
  for (E e : ok) {
    if (value == static_cast<int>(e)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "params.", field, " is ", value, "; expected ", expected));
}

// Unset fields take their defaults (codec.proto) for `codec`. REQUIRES:
// CheckParams OK.
void FillDefaults(v1::Codec codec, v1::CodecParams* p) {
  if (p->block_size() == 0) {
    p->set_block_size(codec == v1::CODEC_BLOCK_TOPK
                          ? impl::kBlockTopKDefaultBlock
                          : 256);
  }
  if (p->k_fraction() == 0.0) p->set_k_fraction(0.01);
  if (p->bits() == 0) p->set_bits(8);
  if (p->percentile() == 0.0f) p->set_percentile(99.0f);
  if (p->value_format() == v1::VALUE_FORMAT_UNSPECIFIED) {
    p->set_value_format(v1::VALUE_FORMAT_FP32);
  }
  if (p->scale_mode() == v1::SCALE_MODE_UNSPECIFIED) {
    p->set_scale_mode(v1::SCALE_MODE_MEAN_ABS);
  }
  if (p->rounding() == v1::ROUNDING_UNSPECIFIED) {
    p->set_rounding(v1::ROUNDING_NEAREST);
  }
  if (p->range() == v1::QUANTIZE_RANGE_UNSPECIFIED) {
    p->set_range(v1::QUANTIZE_RANGE_LINEAR);
  }
  if (p->selection() == v1::TOPK_SELECTION_UNSPECIFIED) {
    p->set_selection(v1::TOPK_SELECTION_SAMPLED);
  }
}

// One decoder per known codec id, built once. Immutable after construction
// and never destroyed, so pointers to it stay valid even during static
// destruction; DecoderFor hands them out without locks or allocation.
class DecoderRegistry {
 public:
  DecoderRegistry() {
    for (const NamedCodec& c : kCodecs) {
      absl::StatusOr<std::unique_ptr<Codec>> codec =
          MakeCodec(c.codec, v1::CodecParams());
      // Default params always pass CheckParams.
      if (codec.ok()) decoders_[c.codec] = std::move(*codec);
    }
    decoders_[v1::CODEC_SEGMENTS] = impl::NewSegmentsDecoder();
    decoders_[v1::CODEC_UNCHANGED] = impl::NewUnchangedDecoder();
    decoders_[v1::CODEC_NO_GRADIENT] = impl::NewNoGradientDecoder();
  }

  const Codec* Get(v1::Codec codec) const {
    const int i = static_cast<int>(codec);
    if (i < 0 || i >= kSize) return nullptr;
    return decoders_[i].get();
  }

 private:
  static constexpr int kSize = v1::Codec_ARRAYSIZE;
  std::unique_ptr<Codec> decoders_[kSize];
};

}  // namespace

namespace impl {

absl::Status CheckParams(const v1::CodecParams& p) {
  // 0 stands for the default of each numeric field; written as "unset or in
  // range" so the message names the value the sender wrote.
  if (!(p.k_fraction() == 0.0 ||
        (p.k_fraction() > 0.0 && p.k_fraction() <= 1.0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params.k_fraction is ", p.k_fraction(), "; expected (0, 1]"));
  }
  if (p.bits() != 0 && (p.bits() < 2 || p.bits() > 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat("params.bits is ", p.bits(), "; expected 2..8"));
  }
  if (!(p.percentile() == 0.0f ||
        (p.percentile() > 0.0f && p.percentile() <= 100.0f))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params.percentile is ", p.percentile(), "; expected (0, 100]"));
  }
  // A row longer than the largest model can divide no tensor.
  if (p.row_length() > kMaxModelElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("params.row_length is ", p.row_length(),
                     "; expected 0 (flat) or 1..", kMaxModelElements));
  }
  absl::Status s = CheckValueFormat(p);
  if (!s.ok()) return s;
  s = EnumIn<v1::ScaleMode>(
      "scale_mode", p.scale_mode(),
      {v1::SCALE_MODE_UNSPECIFIED, v1::SCALE_MODE_MEAN_ABS, v1::SCALE_MODE_L2},
      "SCALE_MODE_MEAN_ABS or SCALE_MODE_L2");
  if (!s.ok()) return s;
  s = EnumIn<v1::Rounding>("rounding", p.rounding(),
                           {v1::ROUNDING_UNSPECIFIED, v1::ROUNDING_NEAREST,
                            v1::ROUNDING_STOCHASTIC},
                           "ROUNDING_NEAREST or ROUNDING_STOCHASTIC");
  if (!s.ok()) return s;
  s = EnumIn<v1::QuantizeRange>(
      "range", p.range(),
      {v1::QUANTIZE_RANGE_UNSPECIFIED, v1::QUANTIZE_RANGE_LINEAR,
       v1::QUANTIZE_RANGE_ADAPTIVE},
      "QUANTIZE_RANGE_LINEAR or QUANTIZE_RANGE_ADAPTIVE");
  if (!s.ok()) return s;
  return EnumIn<v1::TopKSelection>(
      "selection", p.selection(),
      {v1::TOPK_SELECTION_UNSPECIFIED, v1::TOPK_SELECTION_SAMPLED,
       v1::TOPK_SELECTION_EXACT},
      "TOPK_SELECTION_SAMPLED or TOPK_SELECTION_EXACT");
}

}  // namespace impl

absl::Status Codec::Decode(const v1::EncodedTensor& t,
                           absl::Span<float> out) const {
  absl::Status s = Validate(t, out.size());
  if (!s.ok()) return s;
  AssignValid(t, 1.0f, out);
  return absl::OkStatus();
}

void Codec::AssignValid(const v1::EncodedTensor& t, float alpha,
                        absl::Span<float> out) const {
  std::fill(out.begin(), out.end(), 0.0f);
  AccumulateValid(t, alpha, out);
}

void Codec::AddValid(const v1::EncodedTensor& t, absl::Span<const float> base,
                     absl::Span<float> out) const {
  if (base.data() != out.data()) std::copy(base.begin(), base.end(), out.begin());
  AccumulateValid(t, 1.0f, out);
}

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(
    v1::Codec codec, const v1::CodecParams& params) {
  bool known = false;
  for (const NamedCodec& c : kCodecs) known = known || c.codec == codec;
  if (!known) return UnknownCodec(codec);
  absl::Status s = impl::CheckParams(params);
  if (!s.ok()) return s;
  // block_size means something else for block_topk (codec.proto).
  if (codec == v1::CODEC_BLOCK_TOPK) {
    s = impl::CheckBlockTopKBlock(params.block_size(), /*unset_ok=*/true);
    if (!s.ok()) return s;
  }
  v1::CodecParams p = params;
  FillDefaults(codec, &p);
  std::unique_ptr<Codec> c;
  switch (codec) {
    case v1::CODEC_FP32:
    case v1::CODEC_FP16:
    case v1::CODEC_BF16:
      c = impl::NewFloatCodec(codec, p);
      break;
    case v1::CODEC_ONEBIT:
      c = impl::NewOneBitCodec(p);
      break;
    case v1::CODEC_TOPK:
      c = impl::NewTopKCodec(p);
      break;
    case v1::CODEC_RANDOMK:
      c = impl::NewRandomKCodec(p);
      break;
    case v1::CODEC_QUANTIZE:
      c = impl::NewQuantizeCodec(p);
      break;
    case v1::CODEC_TOPK_QUANTIZE:
      c = impl::NewTopKQuantizeCodec(p);
      break;
    case v1::CODEC_BLOCK_TOPK:
      c = impl::NewBlockTopKCodec(p);
      break;
    default:
      return UnknownCodec(codec);
  }
  return c;
}

const Codec* DecoderFor(v1::Codec codec) {
  static const DecoderRegistry* const registry = new DecoderRegistry();
  return registry->Get(codec);
}

absl::StatusOr<const Codec*> FindDecoder(v1::Codec codec) {
  const Codec* decoder = DecoderFor(codec);
  if (decoder == nullptr) return UnknownCodec(codec);
  return decoder;
}

absl::StatusOr<std::unique_ptr<Codec>> MakeDecoderFor(
    const v1::EncodedTensor& t) {
  // The decoder reads the layout from t.params() itself (block_size 0 there
  // means one block); MakeCodec only has to accept the parameters.
  return MakeCodec(t.codec(), t.params());
}

absl::StatusOr<v1::Codec> ParseCodecName(absl::string_view name) {
  std::string lower = absl::AsciiStrToLower(name);
  for (const NamedCodec& c : kCodecs) {
    if (lower == c.name) return c.codec;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "codec name is \"", name, "\"; expected one of ", KnownCodecs()));
}

std::vector<v1::Codec> NamedCodecs() {
  std::vector<v1::Codec> codecs;
  for (const NamedCodec& c : kCodecs) codecs.push_back(c.codec);
  return codecs;
}

std::string CodecName(v1::Codec codec) {
  for (const NamedCodec& c : kCodecs) {
    if (c.codec == codec) return c.name;
  }
  if (codec == v1::CODEC_SEGMENTS) return "segments";
  if (codec == v1::CODEC_UNCHANGED) return "unchanged";
  if (codec == v1::CODEC_NO_GRADIENT) return "no_gradient";
  return absl::StrCat("codec(", static_cast<int>(codec), ")");
}

}  // namespace pserver
