// TopK sparsification (Aji & Heafield 2017; Lin et al. 2018): keep the k
// largest |u| (selection: topk_select.cc). Payload: varint count, varint
// index gaps (topk_indices.cc), values in value_format.
#include "absl/strings/str_cat.h"
#include "common/fused_feedback.h"
#include "common/impl/codecs.h"
#include "common/impl/scratch.h"
#include "common/impl/topk_select.h"

namespace pserver {
namespace impl {
namespace {

// Also its own fused error-feedback kernel (topk_feedback.cc).
class TopKCodec final : public CodecBase, public FusedFeedbackEncoder {
 public:
  explicit TopKCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_TOPK, params) {}

  const FusedFeedbackEncoder* fused_feedback() const override { return this; }

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    ScratchPool<TopKScratch>::Lease s = scratch_.Take();
    const uint64_t k = ResolveK(params(), u.size());
    absl::Status status = SelectTopK(u, k, params().selection(), &*s);
    if (!status.ok()) return status;
    Write(u.size(), k, &*s, out);
    return absl::OkStatus();
  }

  absl::Status EncodeWithFeedback(absl::Span<const float> g,
                                  absl::Span<const float> e_in, float decay,
                                  uint64_t seed, v1::EncodedTensor* out,
                                  absl::Span<float> e_out) const override {
    // ErrorFeedback checked the sizes and decay (FusedFeedbackEncoder).
    ScratchPool<TopKScratch>::Lease s = scratch_.Take();
    const uint64_t k = ResolveK(params(), g.size());
    absl::Status status =
        SelectWithFeedback(g, e_in, decay, k, params().selection(),
                           params().value_format(), e_out, &*s);
    if (!status.ok()) return status;
    Write(g.size(), k, &*s, out);
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

 private:
  // *out = the tensor of the selection in s->sel.
  void Write(uint64_t n, uint64_t k, TopKScratch* s,
             v1::EncodedTensor* out) const {
    StartOutput(n, out);
    out->mutable_params()->set_k(k);
    std::string* payload = out->mutable_payload();
    // Gaps take one or two bytes below a gap of 2^14 (any useful density).
    payload->reserve(s->sel.count * (2 + ValueBytes(params().value_format())) +
                     32);
    AppendIndices(s->sel.indices(), &s->bytes, payload);
    AppendValues(s->sel.values(), params().value_format(), payload);
  }

  // Encoding workspaces (codec.h: calls may run concurrently).
  mutable ScratchPool<TopKScratch> scratch_;
};

}  // namespace

std::unique_ptr<Codec> NewTopKCodec(const v1::CodecParams& params) {
  return std::make_unique<TopKCodec>(params);
}

}  // namespace impl
}  // namespace pserver
