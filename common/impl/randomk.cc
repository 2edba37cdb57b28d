// Random-k sparsification (Stich et al. 2018): k positions drawn from a seed
// shared by encoder and decoder, so only the values travel.
//
// Index set, a pure function of (n, k, seed): Floyd's algorithm (Bentley &
// Floyd 1987) over a bitmap: for j = n-k .. n-1, t = Below(Draw(key, j),
// j + 1) with key = StreamKey(seed); mark t unless marked, else mark j. The
// marked positions in increasing order are the index set. The seed is the
// one in the tensor's params (the encoder writes Mix of params.seed and the
// per-call seed there).
#include <algorithm>
#include <cmath>
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/internal/rng.h"

namespace pserver {
namespace impl {
namespace {

std::vector<uint64_t> IndexSet(uint64_t n, uint64_t k, uint64_t seed) {
  std::vector<uint64_t> bitmap(CeilDiv(n, 64), 0);
  const uint64_t key = internal::StreamKey(seed);
  for (uint64_t j = n - k; j < n; ++j) {
    uint64_t t = internal::Below(internal::Draw(key, j), j + 1);
    if (bitmap[t >> 6] >> (t & 63) & 1) t = j;
    bitmap[t >> 6] |= uint64_t{1} << (t & 63);
  }
  std::vector<uint64_t> idx;
  idx.reserve(k);
  for (uint64_t w = 0; w < bitmap.size(); ++w) {
    for (uint64_t bits = bitmap[w]; bits; bits &= bits - 1) {
      idx.push_back(w * 64 + static_cast<uint64_t>(__builtin_ctzll(bits)));
    }
  }
  return idx;
}

class RandomKCodec final : public CodecBase {
 public:
  explicit RandomKCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_RANDOMK, params) {}

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    absl::Status s = CheckFinite(u);
    if (!s.ok()) return s;
    const uint64_t n = u.size();
    const uint64_t k = ResolveK(params(), n);
    const uint64_t set_seed = internal::Mix64(params().seed() ^
                                              internal::SplitMix64(seed));
    StartOutput(n, out);
    out->mutable_params()->set_k(k);
    out->mutable_params()->set_seed(set_seed);
    std::vector<uint64_t> idx = IndexSet(n, k, set_seed);
    std::vector<float> val(k);
    const float scale = params().unbiased() && k > 0
                            ? static_cast<float>(static_cast<double>(n) / k)
                            : 1.0f;
    for (uint64_t j = 0; j < k; ++j) {
      float v = u[idx[j]] * scale;
      // Scaling can overflow only near FLT_MAX: saturate, stay finite.
      val[j] = std::isfinite(v) ? v : std::copysign(FLT_MAX, v);
    }
    AppendValues(val, params().value_format(), out->mutable_payload());
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    s = CheckValueFormat(t.params());
    if (!s.ok()) return s;
    const uint64_t k = t.params().k();
    if (k > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "params.k is ", k, "; expected at most ", n, " (num_elements)"));
    }
    const v1::ValueFormat f = t.params().value_format();
    const size_t w = ValueBytes(f);
    if (t.payload().size() % w != 0 || t.payload().size() / w != k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload is ", t.payload().size(), " bytes; expected ", k * w,
          " for k = ", k, " randomk values"));
    }
    return CheckValues(reinterpret_cast<const uint8_t*>(t.payload().data()),
                       k, f, "randomk");
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    const uint64_t k = t.params().k();
    std::vector<uint64_t> idx = IndexSet(acc.size(), k, t.params().seed());
    const v1::ValueFormat f = t.params().value_format();
    const size_t w = ValueBytes(f);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.payload().data());
    for (uint64_t j = 0; j < k; ++j) {
      acc[idx[j]] += alpha * LoadValue(p + j * w, f);
    }
  }
};

}  // namespace

std::unique_ptr<Codec> NewRandomKCodec(const v1::CodecParams& params) {
  return std::make_unique<RandomKCodec>(params);
}

}  // namespace impl
}  // namespace pserver
