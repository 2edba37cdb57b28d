// b-bit quantization (QSGD-like, Alistarh et al. 2017), 2 <= b <= 8,
// L = 2^b - 1. Per block either LINEAR: lo = min u, hi = max u, level q
// decodes to lo + q * (hi - lo) / L; or ADAPTIVE: c = the p-th percentile of
// |u| (nearest rank: the ceil(p/100 * len)-th smallest), u clipped to [-c, c],
// q decodes to -c + q * 2c / L. The decode formula is evaluated in double and
// rounded to fp32 once, so it never overflows and decoders agree exactly.
// Nearest rounding picks the closer level (ties up); stochastic rounding
// rounds up with probability equal to the fractional position (unbiased),
// its noise being Draw(StreamKey(seed), i) for element i.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/impl/scratch.h"
#include "common/internal/rng.h"

namespace pserver {
namespace impl {
namespace {

struct Geometry {
  uint64_t block = 1;
  uint64_t blocks = 0;
  uint64_t header_bytes = 0;  // all block scales
  uint64_t level_bytes = 0;
};

Geometry MakeGeometry(uint64_t n, const QuantizeSpec& s) {
  Geometry g;
  g.block = EffectiveBlock(n, s.block_size);
  g.blocks = n == 0 ? 0 : CeilDiv(n, g.block);
  g.header_bytes = g.blocks * (s.adaptive ? 4 : 8);
  g.level_bytes = CeilDiv(n * s.bits, 8);
  return g;
}

// Level -> value for one block: base + q * step, in double.
struct BlockMap {
  double base;
  double step;
};

BlockMap MapFor(const QuantizeSpec& s, float a, float b) {
  const double levels = static_cast<double>((1u << s.bits) - 1);
  if (s.adaptive) return {-static_cast<double>(a), 2.0 * a / levels};
  return {static_cast<double>(a), (static_cast<double>(b) - a) / levels};
}

inline float DecodeLevel(const BlockMap& m, uint32_t q) {
  return static_cast<float>(m.base + q * m.step);
}

// Sequential LSB-first bit stream of b-bit fields.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* p) : p_(p) {}
  void Put(uint32_t v, uint32_t bits) {
    acc_ |= static_cast<uint64_t>(v) << filled_;
    filled_ += bits;
    while (filled_ >= 8) {
      *p_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      filled_ -= 8;
    }
  }
  void Flush() {
    if (filled_ > 0) *p_++ = static_cast<uint8_t>(acc_);
  }

 private:
  uint8_t* p_;
  uint64_t acc_ = 0;
  uint32_t filled_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* p, const uint8_t* end) : p_(p), end_(end) {}
  uint32_t Get(uint32_t bits) {
    while (filled_ < bits) {
      acc_ |= static_cast<uint64_t>(p_ < end_ ? *p_ : 0) << filled_;
      ++p_;
      filled_ += 8;
    }
    uint32_t v = static_cast<uint32_t>(acc_ & ((1u << bits) - 1));
    acc_ >>= bits;
    filled_ -= bits;
    return v;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  uint64_t acc_ = 0;
  uint32_t filled_ = 0;
};

template <typename Sink>
void DecodeEach(absl::string_view payload, uint64_t n, const QuantizeSpec& s,
                Sink sink) {
  Geometry g = MakeGeometry(n, s);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(payload.data());
  BitReader bits(p + g.header_bytes, p + payload.size());
  for (uint64_t b = 0; b < g.blocks; ++b) {
    float a, c = 0;
    const uint8_t* h = p + b * (s.adaptive ? 4 : 8);
    std::memcpy(&a, h, 4);
    if (!s.adaptive) std::memcpy(&c, h + 4, 4);
    BlockMap m = MapFor(s, a, c);
    uint64_t b0 = b * g.block, b1 = std::min(n, b0 + g.block);
    for (uint64_t i = b0; i < b1; ++i) sink(i, DecodeLevel(m, bits.Get(s.bits)));
  }
}

class QuantizeCodec final : public CodecBase {
 public:
  explicit QuantizeCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_QUANTIZE, params) {
    QuantizeSpecFrom(params, &spec_).IgnoreError();  // MakeCodec checked
  }

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    absl::Status s = CheckFinite(u);
    if (!s.ok()) return s;
    StartOutput(u.size(), out);
    out->mutable_params()->set_seed(seed);
    ScratchPool<Buffer<float>>::Lease mags = scratch_.Take();
    QuantizeAppend(u, spec_, seed, &*mags, out->mutable_payload());
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    QuantizeSpec spec;
    s = QuantizeSpecFrom(t.params(), &spec);
    if (!s.ok()) return s;
    return QuantizeCheck(t.payload(), n, spec, "quantize");
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    QuantizeSpec spec;
    QuantizeSpecFrom(t.params(), &spec).IgnoreError();  // validated
    QuantizeAccumulate(t.payload(), acc.size(), spec, alpha, acc.data());
  }
  // One pass each, in the same arithmetic as a copy (or a zero fill) and
  // then AccumulateValid: a pulled 8-bit delta applied to the replica, a
  // shard's first 8-bit push of a chunk in a round.
  void AddValid(const v1::EncodedTensor& t, absl::Span<const float> base,
                absl::Span<float> out) const override {
    QuantizeSpec spec;
    QuantizeSpecFrom(t.params(), &spec).IgnoreError();  // validated
    const float* in = base.data();
    float* o = out.data();
    DecodeEach(t.payload(), out.size(), spec,
               [in, o](uint64_t i, float v) { o[i] = in[i] + v; });
  }
  void AssignValid(const v1::EncodedTensor& t, float alpha,
                   absl::Span<float> out) const override {
    QuantizeSpec spec;
    QuantizeSpecFrom(t.params(), &spec).IgnoreError();  // validated
    float* o = out.data();
    DecodeEach(t.payload(), out.size(), spec,
               [o, alpha](uint64_t i, float v) { o[i] = 0.0f + alpha * v; });
  }

 private:
  QuantizeSpec spec_;
  // |u| of one block for the adaptive range (codec.h: calls may run
  // concurrently).
  mutable ScratchPool<Buffer<float>> scratch_;
};

}  // namespace

absl::Status QuantizeSpecFrom(const v1::CodecParams& p, QuantizeSpec* spec) {
  if (p.bits() < 2 || p.bits() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("params.bits is ", p.bits(), "; expected 2..8"));
  }
  switch (p.range()) {
    case v1::QUANTIZE_RANGE_UNSPECIFIED:
    case v1::QUANTIZE_RANGE_LINEAR:
      spec->adaptive = false;
      break;
    case v1::QUANTIZE_RANGE_ADAPTIVE:
      spec->adaptive = true;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "params.range is ", p.range(),
          "; expected QUANTIZE_RANGE_LINEAR or QUANTIZE_RANGE_ADAPTIVE"));
  }
  spec->bits = p.bits();
  spec->block_size = p.block_size();
  spec->stochastic = p.rounding() == v1::ROUNDING_STOCHASTIC;
  spec->percentile = p.percentile() > 0 ? p.percentile() : 99.0f;
  return absl::OkStatus();
}

void QuantizeAppend(absl::Span<const float> u, const QuantizeSpec& s,
                    uint64_t seed, Buffer<float>* block_mags,
                    std::string* out) {
  const uint64_t n = u.size();
  Geometry g = MakeGeometry(n, s);
  const size_t old = out->size();
  out->resize(old + g.header_bytes + g.level_bytes);
  uint8_t* head = reinterpret_cast<uint8_t*>(&(*out)[old]);
  BitWriter bits(head + g.header_bytes);
  const uint32_t top = (1u << s.bits) - 1;
  const uint64_t key = internal::StreamKey(seed);
  float* const mags = s.adaptive ? block_mags->Reserve(g.block) : nullptr;
  for (uint64_t b = 0; b < g.blocks; ++b) {
    const uint64_t b0 = b * g.block, b1 = std::min(n, b0 + g.block);
    float lo, hi;
    if (s.adaptive) {
      const size_t len = b1 - b0;
      for (uint64_t i = b0; i < b1; ++i) mags[i - b0] = std::fabs(u[i]);
      double want = std::ceil(static_cast<double>(s.percentile) / 100.0 *
                              static_cast<double>(len));
      size_t rank = static_cast<size_t>(
          std::clamp<double>(want, 1.0, static_cast<double>(len)));
      std::nth_element(mags, mags + (rank - 1), mags + len);
      lo = mags[rank - 1];  // c
      hi = lo;
      std::memcpy(head + b * 4, &lo, 4);
    } else {
      lo = hi = u[b0];
      for (uint64_t i = b0; i < b1; ++i) {
        lo = std::min(lo, u[i]);
        hi = std::max(hi, u[i]);
      }
      std::memcpy(head + b * 8, &lo, 4);
      std::memcpy(head + b * 8 + 4, &hi, 4);
    }
    BlockMap m = MapFor(s, lo, hi);
    const double inv = m.step > 0 ? 1.0 / m.step : 0.0;
    for (uint64_t i = b0; i < b1; ++i) {
      double x = u[i];
      if (s.adaptive) x = std::clamp(x, -static_cast<double>(lo),
                                     static_cast<double>(lo));
      double pos = (x - m.base) * inv;  // in [0, L] up to rounding
      double q = s.stochastic
                     ? std::floor(pos + internal::UnitFloat(
                                            internal::Draw(key, i)))
                     : std::floor(pos + 0.5);
      q = std::clamp(q, 0.0, static_cast<double>(top));
      bits.Put(static_cast<uint32_t>(q), s.bits);
    }
  }
  bits.Flush();
}

absl::Status QuantizeCheck(absl::string_view payload, uint64_t n,
                           const QuantizeSpec& s, absl::string_view what) {
  // Bound n by the payload before any arithmetic on it.
  if (n / 8 > payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " payload is ", payload.size(), " bytes; too short for ", n,
        " elements of ", s.bits, " bits"));
  }
  Geometry g = MakeGeometry(n, s);
  if (payload.size() != g.header_bytes + g.level_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " payload is ", payload.size(), " bytes; expected ",
        g.header_bytes + g.level_bytes, " for ", n, " elements of ", s.bits,
        " bits with block ", s.block_size,
        s.adaptive ? " (adaptive range)" : " (linear range)"));
  }
  const uint8_t* p = reinterpret_cast<const uint8_t*>(payload.data());
  for (uint64_t b = 0; b < g.blocks; ++b) {
    float a, c = 0;
    const uint8_t* h = p + b * (s.adaptive ? 4 : 8);
    std::memcpy(&a, h, 4);
    if (!s.adaptive) std::memcpy(&c, h + 4, 4);
    bool ok = s.adaptive ? (a >= 0.0f && a <= FLT_MAX)
                         : (std::isfinite(a) && std::isfinite(c) && a <= c);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " block ", b, s.adaptive ? " clip is " : " range is [", a,
          s.adaptive ? "" : absl::StrCat(", ", c, "]"),
          s.adaptive ? "; expected a finite value >= 0"
                     : "; expected finite lo <= hi"));
    }
  }
  const uint64_t used_bits = n * s.bits;
  if (used_bits % 8 != 0) {
    uint8_t last = p[payload.size() - 1];
    if (last >> (used_bits % 8)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " padding bits of the last byte are ", last >> (used_bits % 8),
          "; expected 0"));
    }
  }
  return absl::OkStatus();
}

void QuantizeAccumulate(absl::string_view payload, uint64_t n,
                        const QuantizeSpec& spec, float alpha, float* acc) {
  DecodeEach(payload, n, spec,
             [acc, alpha](uint64_t i, float v) { acc[i] += alpha * v; });
}

void QuantizeAccumulateAt(absl::string_view payload, const QuantizeSpec& spec,
                          float alpha, IndexWalker* at, float* acc) {
  // DecodeEach visits the values in order, as the walker yields indices.
  DecodeEach(payload, at->count(), spec, [acc, alpha, at](uint64_t, float v) {
    acc[at->Next()] += alpha * v;
  });
}

std::unique_ptr<Codec> NewQuantizeCodec(const v1::CodecParams& params) {
  return std::make_unique<QuantizeCodec>(params);
}

}  // namespace impl
}  // namespace pserver
