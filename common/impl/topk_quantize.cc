// TopK indices with b-bit values (a TopK + QSGD hybrid): varint count c,
// c varint index gaps as CODEC_TOPK, then a CODEC_QUANTIZE payload of the c
// selected values (blocks run over the selected values; stochastic noise of
// value j is Draw(StreamKey(seed), j)).
#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/impl/scratch.h"
#include "common/impl/topk_select.h"

namespace pserver {
namespace impl {
namespace {

class TopKQuantizeCodec final : public CodecBase {
 public:
  explicit TopKQuantizeCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_TOPK_QUANTIZE, params) {
    QuantizeSpecFrom(params, &spec_).IgnoreError();  // MakeCodec checked
  }

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    ScratchPool<Workspace>::Lease scratch = scratch_.Take();
    const uint64_t k = ResolveK(params(), u.size());
    absl::Status s = SelectTopK(u, k, params().selection(), &scratch->select);
    if (!s.ok()) return s;
    StartOutput(u.size(), out);
    out->mutable_params()->set_k(k);
    out->mutable_params()->set_seed(seed);
    std::string* payload = out->mutable_payload();
    AppendIndices(scratch->select.sel.indices(), &scratch->select.bytes,
                  payload);
    QuantizeAppend(scratch->select.sel.values(), spec_, seed,
                   &scratch->block_mags, payload);
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    QuantizeSpec spec;
    s = QuantizeSpecFrom(t.params(), &spec);
    if (!s.ok()) return s;
    uint64_t count;
    size_t offset;
    s = ParseIndices(t.payload(), n, &count, &offset);
    if (!s.ok()) return s;
    return QuantizeCheck(absl::string_view(t.payload()).substr(offset), count,
                         spec, "topk_quantize values");
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    QuantizeSpec spec;
    QuantizeSpecFrom(t.params(), &spec).IgnoreError();  // validated
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.payload().data());
    const uint8_t* end = p + t.payload().size();
    IndexWalker at(p, end);
    const uint8_t* values = at.ValuesBegin();
    QuantizeAccumulateAt(
        absl::string_view(reinterpret_cast<const char*>(values),
                          static_cast<size_t>(end - values)),
        spec, alpha, &at, acc.data());
  }

 private:
  struct Workspace {
    TopKScratch select;
    Buffer<float> block_mags;
  };

  QuantizeSpec spec_;
  // Encoding workspaces (codec.h: calls may run concurrently).
  mutable ScratchPool<Workspace> scratch_;
};

}  // namespace

std::unique_ptr<Codec> NewTopKQuantizeCodec(const v1::CodecParams& params) {
  return std::make_unique<TopKQuantizeCodec>(params);
}

}  // namespace impl
}  // namespace pserver
