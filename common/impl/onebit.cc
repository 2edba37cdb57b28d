// 1-bit sign compression with one fp32 scale per block (Seide et al. 2014;
// Tang et al. 2021): decode(u)_i = sign(u_i) * s_b, s_b = mean |u| over the
// block (or ||u||_2 / sqrt(len), as DeepSpeed). Payload: scales, then sign
// bits LSB-first (1 = +s, also for zero), padding bits zero. Kernels:
// onebit_kernels.cc.
#include <cfloat>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fused_feedback.h"
#include "common/impl/codecs.h"
#include "common/impl/onebit_kernels.h"

namespace pserver {
namespace impl {
namespace {

// Also its own fused error-feedback kernel: the sum pass forms u, the sign
// pass writes the residual.
class OneBitCodec final : public CodecBase, public FusedFeedbackEncoder {
 public:
  explicit OneBitCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_ONEBIT, params) {}

  const FusedFeedbackEncoder* fused_feedback() const override { return this; }

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    OneBitInput a{u.data(), nullptr, 1.0f, nullptr, IsL2()};
    return Run(a, u.size(), out);
  }

  absl::Status EncodeWithFeedback(absl::Span<const float> g,
                                  absl::Span<const float> e_in, float decay,
                                  uint64_t seed, v1::EncodedTensor* out,
                                  absl::Span<float> e_out) const override {
    // ErrorFeedback checked the sizes and decay (FusedFeedbackEncoder).
    OneBitInput a{g.data(), e_in.data(), decay, e_out.data(), IsL2()};
    return Run(a, g.size(), out);
  }

  bool in_place() const override { return true; }
  absl::Status EncodeWithFeedbackInPlace(absl::Span<const float> g,
                                         absl::Span<float> e, float decay,
                                         uint64_t seed, v1::EncodedTensor* out,
                                         double* e_sq) const override {
    OneBitInput a{g.data(), e.data(), decay, e.data(), IsL2(), e_sq};
    return Run(a, g.size(), out);
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    const std::string& payload = t.payload();
    uint32_t block_size = t.params().block_size();
    // Compare sizes before any arithmetic that n could overflow.
    if (n / 8 > payload.size()) return SizeError(payload.size(), n, block_size);
    OneBitLayout l = MakeOneBitLayout(n, block_size);
    if (payload.size() != l.blocks * 4 + l.sign_bytes) {
      return SizeError(payload.size(), n, block_size);
    }
    for (uint64_t b = 0; b < l.blocks; ++b) {
      float sc;
      std::memcpy(&sc, payload.data() + 4 * b, 4);
      if (!(sc >= 0.0f && sc <= FLT_MAX)) {
        return absl::InvalidArgumentError(
            absl::StrCat("scale of block ", b, " is ", sc,
                         "; expected a finite value >= 0"));
      }
    }
    if (n % 8 != 0) {
      uint8_t last = static_cast<uint8_t>(payload.back());
      if (last >> (n % 8)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "padding bits of the last sign byte are ", last >> (n % 8),
            "; expected 0"));
      }
    }
    return absl::OkStatus();
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    const Payload p = View(t, acc.size());
    OneBitAccumulate(p.scales, p.signs, acc.size(), p.l, alpha, acc.data());
  }
  void AddValid(const v1::EncodedTensor& t, absl::Span<const float> base,
                absl::Span<float> out) const override {
    const Payload p = View(t, out.size());
    OneBitAddTo(p.scales, p.signs, out.size(), p.l, 1.0f, base.data(),
                out.data());
  }
  void AssignValid(const v1::EncodedTensor& t, float alpha,
                   absl::Span<float> out) const override {
    const Payload p = View(t, out.size());
    OneBitAssign(p.scales, p.signs, out.size(), p.l, alpha, out.data());
  }

 private:
  // A validated payload of n elements: its layout, block scales and sign
  // bits (which follow the scales).
  struct Payload {
    OneBitLayout l;
    const uint8_t* scales;
    const uint8_t* signs;
  };
  static Payload View(const v1::EncodedTensor& t, uint64_t n) {
    Payload p;
    p.l = MakeOneBitLayout(n, t.params().block_size());
    p.scales = reinterpret_cast<const uint8_t*>(t.payload().data());
    p.signs = p.scales + 4 * p.l.blocks;
    return p;
  }

  bool IsL2() const { return params().scale_mode() == v1::SCALE_MODE_L2; }

  static absl::Status SizeError(size_t got, uint64_t n, uint32_t block) {
    OneBitLayout l = MakeOneBitLayout(n, block);
    unsigned __int128 want =
        static_cast<unsigned __int128>(l.blocks) * 4 + l.sign_bytes;
    return absl::InvalidArgumentError(absl::StrCat(
        "payload is ", got, " bytes; expected ",
        static_cast<uint64_t>(want), " for ", n,
        " onebit elements with block ", block));
  }

  absl::Status Run(const OneBitInput& a, uint64_t n,
                   v1::EncodedTensor* out) const {
    StartOutput(n, out);
    OneBitLayout l = MakeOneBitLayout(n, params().block_size());
    std::string* payload = out->mutable_payload();
    payload->assign(l.blocks * 4 + l.sign_bytes, '\0');
    uint8_t* scales = reinterpret_cast<uint8_t*>(payload->data());
    uint8_t* signs = scales + 4 * l.blocks;
    return OneBitEncode(a, n, l, scales, signs);
  }
};

}  // namespace

std::unique_ptr<Codec> NewOneBitCodec(const v1::CodecParams& params) {
  return std::make_unique<OneBitCodec>(params);
}

}  // namespace impl
}  // namespace pserver
