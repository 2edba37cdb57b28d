// Properties every codec must have, run over every codec configuration, plus
// MakeCodec / DecoderFor / names and the fp16 / bf16 conversions against
// references.
#include "common/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/error_feedback.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::AllCodecCases;
using testing_util::CaseName;
using testing_util::CodecCase;
using testing_util::MustMake;
using testing_util::RandomVector;
using ::testing::HasSubstr;

constexpr size_t kSizes[] = {0, 1, 7, 8, 255, 256, 257, 1000, 4097};

class AllCodecs : public ::testing::TestWithParam<CodecCase> {
 protected:
  std::unique_ptr<Codec> codec_ = MustMake(GetParam().codec, GetParam().params);
};

TEST_P(AllCodecs, RoundTripAndAccumulateAllSizes) {
  for (size_t n : kSizes) {
    SCOPED_TRACE(n);
    std::vector<float> u = RandomVector(n, 7 + n);
    v1::EncodedTensor t;
    ASSERT_TRUE(codec_->Encode(u, 99, &t).ok());
    EXPECT_EQ(t.codec(), GetParam().codec);
    EXPECT_EQ(t.num_elements(), n);
    ASSERT_TRUE(codec_->Validate(t, n).ok()) << codec_->Validate(t, n);
    std::vector<float> d(n, 123.0f);
    ASSERT_TRUE(codec_->Decode(t, absl::MakeSpan(d)).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(d[i])) << i;
    // acc += alpha * decode, exactly as written.
    std::vector<float> acc = RandomVector(n, 3);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = acc[i] + 0.5f * d[i];
    ASSERT_TRUE(codec_->DecodeAccumulate(t, 0.5f, absl::MakeSpan(acc)).ok());
    EXPECT_EQ(acc, want);
    // The shared decoder of the id, which knows only the tensor, agrees.
    const Codec* dec = DecoderFor(t.codec());
    ASSERT_NE(dec, nullptr);
    std::vector<float> d2(n);
    ASSERT_TRUE(dec->Decode(t, absl::MakeSpan(d2)).ok());
    EXPECT_EQ(d, d2);
  }
}

TEST_P(AllCodecs, EncodingIsDeterministic) {
  std::vector<float> u = RandomVector(1000, 1);
  v1::EncodedTensor a, b;
  ASSERT_TRUE(codec_->Encode(u, 5, &a).ok());
  ASSERT_TRUE(codec_->Encode(u, 5, &b).ok());
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
}

TEST_P(AllCodecs, FusedFeedbackEqualsEncodeThenDecode) {
  for (size_t n : kSizes) {
    SCOPED_TRACE(n);
    std::vector<float> g = RandomVector(n, 11), e = RandomVector(n, 12, 0.3f);
    std::vector<float> e_out(n, -7.0f);
    v1::EncodedTensor t;
    ASSERT_TRUE(EncodeWithFeedback(*codec_, g, e, 0.75f, 4, &t,
                                   absl::MakeSpan(e_out))
                    .ok());
    std::vector<float> u(n);
    for (size_t i = 0; i < n; ++i) {
      float d = 0.75f * e[i];
      u[i] = g[i] + d;
    }
    v1::EncodedTensor plain;
    ASSERT_TRUE(codec_->Encode(u, 4, &plain).ok());
    EXPECT_EQ(t.SerializeAsString(), plain.SerializeAsString());
    std::vector<float> d(n);
    ASSERT_TRUE(codec_->Decode(t, absl::MakeSpan(d)).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(e_out[i], u[i] - d[i]) << i;
  }
}

TEST_P(AllCodecs, AllZeroInputDecodesToZeros) {
  for (size_t n : {1, 300, 4097}) {
    std::vector<float> u(n, 0.0f);
    v1::EncodedTensor t;
    ASSERT_TRUE(codec_->Encode(u, 1, &t).ok());
    std::vector<float> d(n, 5.0f);
    ASSERT_TRUE(codec_->Decode(t, absl::MakeSpan(d)).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], 0.0f) << i;
  }
}

TEST_P(AllCodecs, NonFiniteInputRejectedNamingIndex) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (size_t n : {6, 300, 5000}) {
    for (float x : bad) {
      std::vector<float> u = RandomVector(n, 2);
      u[5] = x;
      if (n > 300) u[n - 1] = x;  // only the first is named
      v1::EncodedTensor t;
      absl::Status s = codec_->Encode(u, 1, &t);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n << " " << x;
      EXPECT_THAT(std::string(s.message()), HasSubstr("element 5 "));
      // Through feedback: g finite, but g + decay * e overflows.
      std::vector<float> g(n, 3e38f), e(n, 0.0f), e_out(n);
      e[5] = 3e38f;
      s = EncodeWithFeedback(*codec_, g, e, 1.0f, 1, &t, absl::MakeSpan(e_out));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(s.message()), HasSubstr("element 5 "));
    }
  }
}

TEST_P(AllCodecs, LargeFiniteValuesStayFinite) {
  std::vector<float> u = RandomVector(600, 9);
  for (size_t i = 0; i < u.size(); i += 3) u[i] = (i % 2 ? 1 : -1) * 3e38f;
  v1::EncodedTensor t;
  ASSERT_TRUE(codec_->Encode(u, 1, &t).ok());
  std::vector<float> d(u.size());
  ASSERT_TRUE(codec_->Decode(t, absl::MakeSpan(d)).ok());
  for (float x : d) ASSERT_TRUE(std::isfinite(x));
}

INSTANTIATE_TEST_SUITE_P(Codecs, AllCodecs, ::testing::ValuesIn(AllCodecCases()),
                         CaseName);

TEST(MakeCodec, FillsDefaults) {
  auto c = MakeCodec(v1::CODEC_ONEBIT, {});
  ASSERT_TRUE(c.ok());
  const v1::CodecParams& p = (*c)->params();
  EXPECT_EQ(p.block_size(), 256u);
  EXPECT_DOUBLE_EQ(p.k_fraction(), 0.01);
  EXPECT_EQ(p.bits(), 8u);
  EXPECT_FLOAT_EQ(p.percentile(), 99.0f);
  EXPECT_EQ(p.value_format(), v1::VALUE_FORMAT_FP32);
  EXPECT_EQ(p.scale_mode(), v1::SCALE_MODE_MEAN_ABS);
  EXPECT_EQ(p.selection(), v1::TOPK_SELECTION_SAMPLED);
  EXPECT_EQ((*c)->id(), v1::CODEC_ONEBIT);
}

TEST(MakeCodec, BlockTopKHasItsOwnBlockDefault) {
  auto c = MakeCodec(v1::CODEC_BLOCK_TOPK, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->params().block_size(), 16u);
  EXPECT_EQ((*c)->params().row_length(), 0u);
  EXPECT_DOUBLE_EQ((*c)->params().k_fraction(), 0.01);
}

TEST(MakeCodec, NamesTheBadParameter) {
  struct Case {
    void (*set)(v1::CodecParams*);
    const char* message;
  };
  const Case cases[] = {
      {[](v1::CodecParams* p) { p->set_bits(9); }, "params.bits is 9; expected 2..8"},
      {[](v1::CodecParams* p) { p->set_bits(1); }, "params.bits is 1; expected 2..8"},
      {[](v1::CodecParams* p) { p->set_k_fraction(1.5); },
       "params.k_fraction is 1.5; expected (0, 1]"},
      {[](v1::CodecParams* p) { p->set_k_fraction(-0.1); }, "params.k_fraction"},
      {[](v1::CodecParams* p) { p->set_percentile(101); },
       "params.percentile is 101; expected (0, 100]"},
      {[](v1::CodecParams* p) { p->set_percentile(NAN); }, "params.percentile"},
      {[](v1::CodecParams* p) { p->set_value_format(static_cast<v1::ValueFormat>(7)); },
       "params.value_format is 7"},
      {[](v1::CodecParams* p) { p->set_scale_mode(static_cast<v1::ScaleMode>(9)); },
       "params.scale_mode is 9"},
      {[](v1::CodecParams* p) { p->set_rounding(static_cast<v1::Rounding>(9)); },
       "params.rounding is 9"},
      {[](v1::CodecParams* p) { p->set_range(static_cast<v1::QuantizeRange>(9)); },
       "params.range is 9"},
      {[](v1::CodecParams* p) { p->set_selection(static_cast<v1::TopKSelection>(9)); },
       "params.selection is 9"},
      {[](v1::CodecParams* p) { p->set_row_length(uint64_t{1} << 40); },
       "params.row_length is 1099511627776; expected 0 (flat) or 1..536870912"},
  };
  for (const Case& c : cases) {
    v1::CodecParams p;
    c.set(&p);
    auto codec = MakeCodec(v1::CODEC_QUANTIZE, p);
    ASSERT_FALSE(codec.ok()) << c.message;
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(codec.status().message()), HasSubstr(c.message));
  }
}

TEST(MakeCodec, UnknownCodec) {
  for (int id : {0, 10, 42, -1}) {
    auto c = MakeCodec(static_cast<v1::Codec>(id), {});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()),
                HasSubstr(absl::StrCat("codec is ", id, "; expected one of fp32, fp16")));
  }
  v1::EncodedTensor t;
  t.set_codec(static_cast<v1::Codec>(42));
  auto d = MakeDecoderFor(t);  // deprecated, still answers the same
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("codec is 42; expected one of"));
}

TEST(DecoderFor, ReturnsTheSameInstanceEveryTime) {
  for (v1::Codec c : {v1::CODEC_FP32, v1::CODEC_ONEBIT, v1::CODEC_TOPK_QUANTIZE}) {
    const Codec* a = DecoderFor(c);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(DecoderFor(c), a);
    auto found = FindDecoder(c);
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(*found, a);
  }
}

TEST(DecoderFor, EveryCodecInTheEnumHasADecoder) {
  const google::protobuf::EnumDescriptor* e = v1::Codec_descriptor();
  ASSERT_GT(e->value_count(), 1);
  for (int i = 0; i < e->value_count(); ++i) {
    const auto id = static_cast<v1::Codec>(e->value(i)->number());
    if (id == v1::CODEC_UNSPECIFIED) continue;
    SCOPED_TRACE(e->value(i)->name());
    const Codec* dec = DecoderFor(id);
    // Segments, unchanged and no_gradient only decode (tensor_codecs_test,
    // unchanged_test and no_gradient_push_test cover them).
    if (id == v1::CODEC_SEGMENTS || id == v1::CODEC_UNCHANGED ||
        id == v1::CODEC_NO_GRADIENT) {
      ASSERT_NE(dec, nullptr);
      EXPECT_FALSE(MakeCodec(id, {}).ok());
      continue;
    }
    ASSERT_NE(dec, nullptr);
    EXPECT_EQ(dec->id(), id);
    // It decodes what a configured encoder of that id produced.
    auto enc = MustMake(id);
    std::vector<float> u = RandomVector(300, 1);
    v1::EncodedTensor t;
    ASSERT_TRUE(enc->Encode(u, 2, &t).ok());
    std::vector<float> a(300), b(300);
    ASSERT_TRUE(enc->Decode(t, absl::MakeSpan(a)).ok());
    ASSERT_TRUE(dec->Decode(t, absl::MakeSpan(b)).ok());
    EXPECT_EQ(a, b);
  }
}

TEST(DecoderFor, RefusesUnknownIds) {
  for (int id : {0, 13, 42, -1, 1 << 30}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(DecoderFor(static_cast<v1::Codec>(id)), nullptr);
    auto found = FindDecoder(static_cast<v1::Codec>(id));
    ASSERT_FALSE(found.ok());
    EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(found.status().message()),
                HasSubstr(absl::StrCat("codec is ", id,
                                       "; expected one of fp32, fp16, bf16")));
  }
}

TEST(CodecName, ParsesEveryNameCaseInsensitively) {
  for (const char* name : {"fp32", "fp16", "bf16", "onebit", "topk", "randomk",
                           "quantize", "topk_quantize", "block_topk"}) {
    auto c = ParseCodecName(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(CodecName(*c), name);
    std::string upper = name;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(ch));
    auto c2 = ParseCodecName(upper);
    ASSERT_TRUE(c2.ok());
    EXPECT_EQ(*c2, *c);
  }
  auto bad = ParseCodecName("twobit");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("twobit"));
}

// ---- fp16 / bf16 against references built by enumerating the narrow formats.

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Value of a finite binary16 by the textbook formula.
double RefHalfValue(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

// Nearest finite value of a format given all its non-negative finite values
// in increasing order; ties to the even bit pattern; saturating.
template <typename T>
T RefRound(double x, const std::vector<std::pair<double, T>>& table) {
  T sign = x < 0 || (x == 0 && std::signbit(x)) ? T(0x8000) : T(0);
  double a = std::fabs(x);
  auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(a, T(0)),
                             [](auto& l, auto& r) { return l.first < r.first; });
  if (it == table.end()) return sign | table.back().second;
  if (it->first == a || it == table.begin()) return sign | it->second;
  auto lo = it - 1;
  double dlo = a - lo->first, dhi = it->first - a;
  if (dlo < dhi) return sign | lo->second;
  if (dhi < dlo) return sign | it->second;
  return sign | ((lo->second & 1) ? it->second : lo->second);
}

std::vector<float> Fp16TestValues() {
  std::vector<float> xs = RandomVector(20000, 77, 100.0f);
  std::vector<float> small = RandomVector(20000, 78, 1e-5f);
  xs.insert(xs.end(), small.begin(), small.end());
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    double v = RefHalfValue(static_cast<uint16_t>(h));
    double next = h + 1 < 0x7c00 ? RefHalfValue(static_cast<uint16_t>(h + 1)) : 65536.0;
    xs.push_back(static_cast<float>(v));
    xs.push_back(static_cast<float>((v + next) / 2));  // exact ties
    xs.push_back(-static_cast<float>((v + next) / 2));
    xs.push_back(std::nextafter(static_cast<float>((v + next) / 2), 0.0f));
    xs.push_back(std::nextafter(static_cast<float>((v + next) / 2), 1e9f));
  }
  for (float x : {65504.0f, 65519.0f, 65520.0f, 70000.0f, 3e38f, -3e38f,
                  std::numeric_limits<float>::denorm_min(), -0.0f}) {
    xs.push_back(x);
  }
  return xs;
}

TEST(Fp16Codec, MatchesReferenceRoundingAndSaturation) {
  std::vector<std::pair<double, uint16_t>> table;
  for (uint32_t h = 0; h < 0x7c00; ++h) table.push_back({RefHalfValue(h), h});
  std::vector<float> xs = Fp16TestValues();
  auto codec = MustMake(v1::CODEC_FP16);
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(xs, 0, &t).ok());
  ASSERT_EQ(t.payload().size(), xs.size() * 2);
  std::vector<float> d(xs.size());
  ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
  for (size_t i = 0; i < xs.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, t.payload().data() + 2 * i, 2);
    uint16_t want = RefRound<uint16_t>(xs[i], table);
    ASSERT_EQ(got, want) << "x=" << xs[i];
    ASSERT_EQ(static_cast<double>(d[i]), RefHalfValue(want)) << xs[i];
  }
}

TEST(Bf16Codec, MatchesReferenceRoundingAndSaturation) {
  std::vector<std::pair<double, uint16_t>> table;
  for (uint32_t h = 0; h < 0x7f80; ++h) {
    table.push_back({static_cast<double>(FromBits(h << 16)), static_cast<uint16_t>(h)});
  }
  std::vector<float> xs = RandomVector(50000, 79, 1000.0f);
  for (uint32_t h = 0; h < 0x7f80; h += 7) {
    float v = FromBits(h << 16), next = FromBits((h + 1) << 16);
    double mid = (static_cast<double>(v) + next) / 2;
    if (h + 1 < 0x7f80) {
      xs.push_back(static_cast<float>(mid));
      xs.push_back(std::nextafter(static_cast<float>(mid), 0.0f));
    }
    xs.push_back(-v);
  }
  for (float x : {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  FromBits(0x7f7f8000), FromBits(0x7f7f7fff), -0.0f}) {
    xs.push_back(x);
  }
  auto codec = MustMake(v1::CODEC_BF16);
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(xs, 0, &t).ok());
  std::vector<float> d(xs.size());
  ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
  for (size_t i = 0; i < xs.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, t.payload().data() + 2 * i, 2);
    uint16_t want = RefRound<uint16_t>(xs[i], table);
    ASSERT_EQ(got, want) << "x=" << xs[i];
    ASSERT_EQ(d[i], FromBits(static_cast<uint32_t>(want) << 16));  // -0 == 0
  }
}

TEST(Fp32Codec, IsExactLittleEndianCopy) {
  std::vector<float> xs = RandomVector(257, 5);
  xs[3] = -0.0f;
  xs[4] = std::numeric_limits<float>::denorm_min();
  auto codec = MustMake(v1::CODEC_FP32);
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(xs, 0, &t).ok());
  ASSERT_EQ(t.payload().size(), 257u * 4);
  for (size_t i = 0; i < xs.size(); ++i) {
    const unsigned char* p =
        reinterpret_cast<const unsigned char*>(t.payload().data()) + 4 * i;
    uint32_t le = p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
    ASSERT_EQ(le, Bits(xs[i]));
  }
}

}  // namespace
}  // namespace pserver
