// ValidateTensor / ValidatedTensor: the token decodes exactly as Codec::Decode,
// and every refusal is the one MakeDecoderFor + Validate gave.
#include "common/validated_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"
#include "tests/test_util/test_helpers.h"

namespace pserver {
namespace {

using testing_util::AllCodecCases;
using testing_util::CaseName;
using testing_util::CodecCase;
using testing_util::MustMake;
using testing_util::RandomVector;
using ::testing::HasSubstr;

// A token for a temporary tensor would dangle: that call must not compile.
template <typename T, typename = void>
struct CanValidate : std::false_type {};
template <typename T>
struct CanValidate<T, std::void_t<decltype(ValidateTensor(
                          std::declval<T>(), uint64_t{0}))>>
    : std::true_type {};
static_assert(CanValidate<const v1::EncodedTensor&>::value);
static_assert(CanValidate<v1::EncodedTensor&>::value);
static_assert(!CanValidate<v1::EncodedTensor&&>::value);
static_assert(!CanValidate<v1::EncodedTensor>::value);

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return testing_util::BitEqual(a, b);
}

class ValidatedTensorAllCodecs : public ::testing::TestWithParam<CodecCase> {};

TEST_P(ValidatedTensorAllCodecs, DecodesBitForBitLikeCodecDecode) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  for (size_t n : {0, 1, 7, 255, 257, 1000, 4097, 70000}) {
    SCOPED_TRACE(n);
    std::vector<float> u = RandomVector(n, 3 + n);
    for (size_t i = 0; i < n; i += 4) u[i] = 0.0f;  // ties and zeros
    v1::EncodedTensor t;
    ASSERT_TRUE(codec->Encode(u, 17, &t).ok());
    absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, n);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(&v->tensor(), &t);
    EXPECT_EQ(v->codec(), GetParam().codec);
    EXPECT_EQ(v->num_elements(), n);

    std::vector<float> want(n, -1.0f), got(n, 5.0f);
    ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(want)).ok());
    v->DecodeInto(absl::MakeSpan(got));
    EXPECT_TRUE(SameBits(got, want));

    std::vector<float> acc_want = RandomVector(n, 9), acc_got = acc_want;
    ASSERT_TRUE(codec->DecodeAccumulate(t, -0.3f, absl::MakeSpan(acc_want)).ok());
    const ValidatedTensor copy = *v;  // two pointers: copies decode the same
    copy.AccumulateInto(-0.3f, absl::MakeSpan(acc_got));
    EXPECT_TRUE(SameBits(acc_got, acc_want));
  }
}

// AddInto (the replica applying a pulled delta) is a copy of the base and
// then AccumulateInto(1), bit for bit, into another buffer and in place;
// the base is left as it was when it is not the output.
TEST_P(ValidatedTensorAllCodecs, AddIntoIsCopyThenAccumulateBitForBit) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  for (size_t n : {0, 1, 7, 255, 257, 1000, 4097, 70000}) {
    SCOPED_TRACE(n);
    std::vector<float> u = RandomVector(n, 5 + n);
    v1::EncodedTensor t;
    ASSERT_TRUE(codec->Encode(u, 19, &t).ok());
    absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, n);
    ASSERT_TRUE(v.ok()) << v.status();
    const std::vector<float> base = RandomVector(n, 11 + n);
    std::vector<float> want = base;
    v->AccumulateInto(1.0f, absl::MakeSpan(want));

    std::vector<float> out(n, 7.0f);
    v->AddInto(base, absl::MakeSpan(out));
    EXPECT_TRUE(SameBits(out, want));
    EXPECT_TRUE(SameBits(base, RandomVector(n, 11 + n)));

    std::vector<float> in_place = base;
    v->AddInto(in_place, absl::MakeSpan(in_place));
    EXPECT_TRUE(SameBits(in_place, want));
  }
}

// AssignInto (the shard's first push of a chunk, a decoded snapshot) is a
// zero-filled output and then AccumulateInto(alpha), bit for bit: what the
// output held (NaN here) is not read, and a decoded -0 comes out +0 as
// 0 + -0 does. Zero blocks give 1-bit and quantize a scale of 0 (+-0).
TEST_P(ValidatedTensorAllCodecs, AssignIntoIsZeroFillThenAccumulateBitForBit) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  for (size_t n : {0, 1, 7, 255, 257, 1000, 4097, 70000}) {
    SCOPED_TRACE(n);
    std::vector<float> u = RandomVector(n, 7 + n);
    for (size_t i = 0; i < std::min<size_t>(n, 600); ++i) u[i] = -0.0f;
    v1::EncodedTensor t;
    ASSERT_TRUE(codec->Encode(u, 23, &t).ok());
    absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, n);
    ASSERT_TRUE(v.ok()) << v.status();
    for (float alpha : {1.0f, -0.3f, 0.0f}) {
      SCOPED_TRACE(alpha);
      std::vector<float> want(n, 0.0f);
      v->AccumulateInto(alpha, absl::MakeSpan(want));
      std::vector<float> got(n, std::numeric_limits<float>::quiet_NaN());
      v->AssignInto(alpha, absl::MakeSpan(got));
      EXPECT_TRUE(SameBits(got, want));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, ValidatedTensorAllCodecs,
                         ::testing::ValuesIn(AllCodecCases()), CaseName);

v1::EncodedTensor Encoded(v1::Codec c, size_t n = 100) {
  v1::EncodedTensor t;
  EXPECT_TRUE(MustMake(c)->Encode(RandomVector(n, 1), 2, &t).ok());
  return t;
}

// Refused with INVALID_ARGUMENT containing `message`; no token.
void ExpectRefused(const v1::EncodedTensor& t, uint64_t n,
                   const std::string& message) {
  SCOPED_TRACE(message);
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, n);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr(message));
}

TEST(ValidateTensor, RefusesUnknownCodecNamingTheNumber) {
  v1::EncodedTensor t = Encoded(v1::CODEC_FP32);
  for (int id : {0, 13, 42, -1}) {
    t.set_codec(static_cast<v1::Codec>(id));
    ExpectRefused(t, 100,
                  absl::StrCat("codec is ", id,
                               "; expected one of fp32, fp16, bf16, onebit, "
                               "topk, randomk, quantize, topk_quantize, "
                               "block_topk"));
  }
}

// Every params field is range-checked whatever the codec, with the message
// and precedence MakeDecoderFor (deprecated) had.
TEST(ValidateTensor, ChecksEveryParamsFieldLikeMakeDecoderFor) {
  struct Case {
    void (*set)(v1::CodecParams*);
    const char* message;
  };
  const Case cases[] = {
      {[](v1::CodecParams* p) { p->set_bits(9); }, "params.bits is 9; expected 2..8"},
      {[](v1::CodecParams* p) { p->set_bits(1); }, "params.bits is 1; expected 2..8"},
      {[](v1::CodecParams* p) { p->set_k_fraction(1.5); },
       "params.k_fraction is 1.5; expected (0, 1]"},
      {[](v1::CodecParams* p) { p->set_k_fraction(-0.1); },
       "params.k_fraction is -0.1; expected (0, 1]"},
      {[](v1::CodecParams* p) { p->set_percentile(101); },
       "params.percentile is 101; expected (0, 100]"},
      {[](v1::CodecParams* p) { p->set_percentile(NAN); }, "params.percentile is nan"},
      {[](v1::CodecParams* p) { p->set_value_format(static_cast<v1::ValueFormat>(7)); },
       "params.value_format is 7; expected VALUE_FORMAT_FP32 or VALUE_FORMAT_FP16"},
      {[](v1::CodecParams* p) { p->set_scale_mode(static_cast<v1::ScaleMode>(9)); },
       "params.scale_mode is 9; expected SCALE_MODE_MEAN_ABS or SCALE_MODE_L2"},
      {[](v1::CodecParams* p) { p->set_rounding(static_cast<v1::Rounding>(9)); },
       "params.rounding is 9; expected ROUNDING_NEAREST or ROUNDING_STOCHASTIC"},
      {[](v1::CodecParams* p) { p->set_range(static_cast<v1::QuantizeRange>(-1)); },
       "params.range is -1; expected QUANTIZE_RANGE_LINEAR or QUANTIZE_RANGE_ADAPTIVE"},
      {[](v1::CodecParams* p) { p->set_selection(static_cast<v1::TopKSelection>(9)); },
       "params.selection is 9; expected TOPK_SELECTION_SAMPLED or TOPK_SELECTION_EXACT"},
      {[](v1::CodecParams* p) { p->set_row_length(uint64_t{1} << 29 | 1); },
       "params.row_length is 536870913; expected 0 (flat) or 1..536870912"},
  };
  // fp32 and onebit read none of these fields; quantize reads bits and range;
  // block_topk reads row_length.
  for (v1::Codec c : {v1::CODEC_FP32, v1::CODEC_ONEBIT, v1::CODEC_QUANTIZE,
                      v1::CODEC_BLOCK_TOPK}) {
    for (const Case& k : cases) {
      SCOPED_TRACE(CodecName(c));
      v1::EncodedTensor t = Encoded(c);
      k.set(t.mutable_params());
      ExpectRefused(t, 100, k.message);
      auto old = MakeDecoderFor(t);
      ASSERT_FALSE(old.ok());
      EXPECT_EQ(ValidateTensor(t, 100).status(), old.status());
      // Params are checked before the element count, as before.
      ExpectRefused(t, 99, k.message);
    }
  }
}

TEST(ValidateTensor, BlockTopKBlockSizeIsCheckedBeforeTheElementCount) {
  v1::EncodedTensor t = Encoded(v1::CODEC_BLOCK_TOPK);
  for (uint32_t b : {0u, 3u, 65u, 256u}) {
    t.mutable_params()->set_block_size(b);
    const std::string message =
        absl::StrCat("params.block_size is ", b, "; expected 4..64 for block_topk");
    ExpectRefused(t, 100, message);
    ExpectRefused(t, 99, message);
  }
  t.mutable_params()->set_block_size(64);
  ExpectRefused(t, 99, "num_elements is 100; expected 99");
}

TEST(ValidateTensor, RefusesBadHeadersAndPayloads) {
  v1::EncodedTensor t = Encoded(v1::CODEC_ONEBIT, 1000);
  ExpectRefused(t, 999, "num_elements is 1000; expected 999");
  ExpectRefused(t, uint64_t{1} << 62, "num_elements is 1000; expected 4611686018427387904");
  v1::EncodedTensor u = t;
  u.mutable_payload()->pop_back();
  ExpectRefused(u, 1000, "payload is 140 bytes; expected 141 for 1000 onebit elements with block 256");
  u = Encoded(v1::CODEC_FP16);
  (*u.mutable_payload())[7] = static_cast<char>(0x7c);  // element 3: +Inf
  (*u.mutable_payload())[6] = 0;
  ExpectRefused(u, 100, "payload element 3 is not finite");
  u = Encoded(v1::CODEC_TOPK);
  u.mutable_payload()->append("x");
  ExpectRefused(u, 100, "value bytes after the indices");
}

TEST(ValidatedTensorDeathTest, WrongOutputSizeIsAProgrammerError) {
  v1::EncodedTensor t = Encoded(v1::CODEC_FP32);
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, 100);
  ASSERT_TRUE(v.ok());
  std::vector<float> small(3);
  EXPECT_DEATH(v->AccumulateInto(1.0f, absl::MakeSpan(small)),
               "output holds 3 elements; the tensor has 100");
  EXPECT_DEATH(v->DecodeInto(absl::MakeSpan(small)), "output holds 3");
}

}  // namespace
}  // namespace pserver
