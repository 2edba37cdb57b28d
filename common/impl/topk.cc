// TopK sparsification (Aji & Heafield 2017; Lin et al. 2018): keep the k
// largest |u| (selection: topk_select.cc). Payload: varint count, varint
// index gaps (topk_indices.cc), values in value_format.
#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"

namespace pserver {
namespace impl {
namespace {

class TopKCodec final : public CodecBase {
 public:
  explicit TopKCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_TOPK, params) {}

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    std::vector<uint64_t> idx;
    std::vector<float> val;
    uint64_t k = ResolveK(params(), u.size());
    absl::Status s = SelectTopK(u, k, params().selection(), &idx, &val);
    if (!s.ok()) return s;
    StartOutput(u.size(), out);
    out->mutable_params()->set_k(k);
    std::string* payload = out->mutable_payload();
    payload->reserve(idx.size() * 8 + 10);
    AppendIndices(idx, payload);
    AppendValues(val, params().value_format(), payload);
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    s = CheckValueFormat(t.params());
    if (!s.ok()) return s;
    uint64_t count;
    size_t offset;
    s = ParseIndices(t.payload(), n, &count, &offset);
    if (!s.ok()) return s;
    const v1::ValueFormat f = t.params().value_format();
    const size_t rest = t.payload().size() - offset;
    if (rest / ValueBytes(f) != count || rest % ValueBytes(f) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload has ", rest, " value bytes after the indices; expected ",
          count * ValueBytes(f), " for ", count, " topk values"));
    }
    return CheckValues(
        reinterpret_cast<const uint8_t*>(t.payload().data()) + offset, count,
        f, "topk");
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.payload().data());
    const uint8_t* end = p + t.payload().size();
    IndexWalker at(p, end);
    const v1::ValueFormat f = t.params().value_format();
    const size_t w = ValueBytes(f);
    const uint8_t* values = end - at.count() * w;
    for (uint64_t j = 0; j < at.count(); ++j) {
      acc[at.Next()] += alpha * LoadValue(values + j * w, f);
    }
  }
};

}  // namespace

std::unique_ptr<Codec> NewTopKCodec(const v1::CodecParams& params) {
  return std::make_unique<TopKCodec>(params);
}

}  // namespace impl
}  // namespace pserver
