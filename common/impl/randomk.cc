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
#include "common/impl/scratch.h"
#include "common/internal/rng.h"

namespace pserver {
namespace impl {
namespace {

// Workspace of one call: the index set's bitmap and the selected values.
struct RandomKScratch {
  Buffer<uint64_t> bitmap;
  Buffer<float> val;
};

// Marks the index set of (n, k, seed) in s->bitmap (CeilDiv(n, 64) words)
// and returns it.
const uint64_t* MarkIndexSet(uint64_t n, uint64_t k, uint64_t seed,
                             RandomKScratch* s) {
  const size_t words = CeilDiv(n, 64);
  uint64_t* bitmap = s->bitmap.Reserve(words);
  std::fill(bitmap, bitmap + words, 0);
  const uint64_t key = internal::StreamKey(seed);
  for (uint64_t j = n - k; j < n; ++j) {
    uint64_t t = internal::Below(internal::Draw(key, j), j + 1);
    if (bitmap[t >> 6] >> (t & 63) & 1) t = j;
    bitmap[t >> 6] |= uint64_t{1} << (t & 63);
  }
  return bitmap;
}

// Calls f(j, index) for the marked indices in increasing order, j = 0, 1...
template <typename F>
void ForEachIndex(const uint64_t* bitmap, uint64_t n, F f) {
  uint64_t j = 0;
  for (uint64_t w = 0; w < CeilDiv(n, 64); ++w) {
    for (uint64_t bits = bitmap[w]; bits; bits &= bits - 1) {
      f(j++, w * 64 + static_cast<uint64_t>(__builtin_ctzll(bits)));
    }
  }
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
    ScratchPool<RandomKScratch>::Lease scratch = scratch_.Take();
    const uint64_t* bitmap = MarkIndexSet(n, k, set_seed, &*scratch);
    float* val = scratch->val.Reserve(k);
    const float scale = params().unbiased() && k > 0
                            ? static_cast<float>(static_cast<double>(n) / k)
                            : 1.0f;
    ForEachIndex(bitmap, n, [&](uint64_t j, uint64_t i) {
      float v = u[i] * scale;
      // Scaling can overflow only near FLT_MAX: saturate, stay finite.
      val[j] = std::isfinite(v) ? v : std::copysign(FLT_MAX, v);
    });
    AppendValues(absl::MakeConstSpan(val, k), params().value_format(),
                 out->mutable_payload());
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
    const uint64_t n = acc.size();
    ScratchPool<RandomKScratch>::Lease s = scratch_.Take();
    const uint64_t* bitmap = MarkIndexSet(n, t.params().k(), t.params().seed(),
                                          &*s);
    const v1::ValueFormat f = t.params().value_format();
    const size_t w = ValueBytes(f);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.payload().data());
    float* a = acc.data();
    ForEachIndex(bitmap, n, [&](uint64_t j, uint64_t i) {
      a[i] += alpha * LoadValue(p + j * w, f);
    });
  }

 private:
  // Encoding and decoding workspaces: DecoderFor's instance decodes on many
  // threads at once (codec.h).
  mutable ScratchPool<RandomKScratch> scratch_;
};

}  // namespace

std::unique_ptr<Codec> NewRandomKCodec(const v1::CodecParams& params) {
  return std::make_unique<RandomKCodec>(params);
}

}  // namespace impl
}  // namespace pserver
