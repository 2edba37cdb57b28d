// Untrusted tensors: every malformed case is INVALID_ARGUMENT naming the
// field, and the accumulator is left byte-for-byte unchanged.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/validated_tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::AllCodecCases;
using testing_util::MustMake;
using testing_util::RandomVector;
using ::testing::HasSubstr;

constexpr size_t kN = 1000;

v1::EncodedTensor EncodeWith(v1::Codec c, const v1::CodecParams& p,
                             size_t n = kN) {
  auto codec = MustMake(c, p);
  v1::EncodedTensor t;
  EXPECT_TRUE(codec->Encode(RandomVector(n, 5), 3, &t).ok());
  return t;
}

// Decoding `t` into n elements fails with `message` through a decoder for
// `c`, and ValidateTensor refuses it (no token, so nothing to decode).
void ExpectRejected(const v1::EncodedTensor& t, v1::Codec c,
                    const std::string& message, size_t n = kN) {
  SCOPED_TRACE(message);
  std::vector<float> acc = RandomVector(n, 8);
  const std::vector<float> before = acc;
  auto codec = MustMake(c);
  absl::Status s = codec->DecodeAccumulate(t, 1.0f, absl::MakeSpan(acc));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  EXPECT_EQ(0, std::memcmp(acc.data(), before.data(), n * 4));
  s = codec->Decode(t, absl::MakeSpan(acc));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(0, std::memcmp(acc.data(), before.data(), n * 4));
  // Not this codec's tensor: the decoder of its own codec may accept it.
  if (t.codec() != c) return;
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, n);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr(message));
}

void PutFloat(std::string* s, size_t at, float v) { std::memcpy(&(*s)[at], &v, 4); }

TEST(CodecBadInput, HeaderMismatches) {
  v1::EncodedTensor t = EncodeWith(v1::CODEC_ONEBIT, {});
  v1::EncodedTensor u = t;
  u.set_num_elements(999);
  ExpectRejected(u, v1::CODEC_ONEBIT, "num_elements is 999; expected 1000");
  u = t;
  u.set_num_elements(uint64_t{1} << 62);
  ExpectRejected(u, v1::CODEC_ONEBIT, "num_elements is 4611686018427387904");
  ExpectRejected(t, v1::CODEC_TOPK, "codec is onebit; expected topk");
  u = t;
  u.set_codec(static_cast<v1::Codec>(42));
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(u, kN);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(std::string(v.status().message()),
              HasSubstr("codec is 42; expected one of fp32, fp16, bf16, onebit"));
}

TEST(CodecBadInput, AbsurdElementCountsNeverAllocate) {
  // Validate with an absurd expected count must answer from sizes alone.
  for (const auto& c : AllCodecCases()) {
    SCOPED_TRACE(c.name);
    v1::EncodedTensor t = EncodeWith(c.codec, c.params);
    for (uint64_t n : {uint64_t{1} << 40, uint64_t{1} << 62, ~uint64_t{0}}) {
      t.set_num_elements(n);
      auto codec = MustMake(c.codec, c.params);
      absl::Status s = codec->Validate(t, n);
      // A sparse payload is legitimately valid for any n >= its indices;
      // dense ones must be rejected by their size.
      bool sparse = c.codec == v1::CODEC_TOPK || c.codec == v1::CODEC_RANDOMK ||
                    c.codec == v1::CODEC_TOPK_QUANTIZE ||
                    c.codec == v1::CODEC_BLOCK_TOPK;
      if (!sparse) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
      }
    }
  }
}

TEST(CodecBadInput, FloatCodecs) {
  for (v1::Codec c : {v1::CODEC_FP32, v1::CODEC_FP16, v1::CODEC_BF16}) {
    v1::EncodedTensor t = EncodeWith(c, {});
    size_t w = c == v1::CODEC_FP32 ? 4 : 2;
    std::string name = CodecName(c);
    v1::EncodedTensor u = t;
    u.mutable_payload()->pop_back();
    ExpectRejected(u, c, absl::StrCat("payload is ", kN * w - 1, " bytes; expected ",
                                      kN * w, " for 1000 ", name, " elements"));
    u = t;
    u.mutable_payload()->append(w, '\0');
    ExpectRejected(u, c, absl::StrCat("payload is ", kN * w + w, " bytes"));
    u = t;
    u.clear_payload();
    ExpectRejected(u, c, "payload is 0 bytes");
    u = t;
    // Exponent all ones at element 17: Inf/NaN in every format.
    (*u.mutable_payload())[17 * w + w - 1] = static_cast<char>(0x7f);
    (*u.mutable_payload())[17 * w + w - 2] = static_cast<char>(0xff);
    ExpectRejected(u, c, "payload element 17 is not finite");
  }
}

TEST(CodecBadInput, OneBit) {
  const v1::Codec c = v1::CODEC_ONEBIT;
  v1::EncodedTensor t = EncodeWith(c, {});
  ASSERT_EQ(t.payload().size(), 4u * 4 + 125);
  v1::EncodedTensor u = t;
  u.mutable_payload()->resize(100);
  ExpectRejected(u, c, "payload is 100 bytes; expected 141 for 1000 onebit elements with block 256");
  u = t;
  u.mutable_payload()->push_back('\0');
  ExpectRejected(u, c, "payload is 142 bytes; expected 141");
  u = t;
  u.mutable_params()->set_block_size(100);
  ExpectRejected(u, c, "expected 165 for 1000 onebit elements with block 100");
  for (float bad : {NAN, INFINITY, -INFINITY, -1.0f}) {
    u = t;
    PutFloat(u.mutable_payload(), 8, bad);
    ExpectRejected(u, c, "scale of block 2 is ");
  }
  // 999 elements: the top bit of the last byte is padding.
  v1::EncodedTensor p = EncodeWith(c, {}, 999);
  p.mutable_payload()->back() |= static_cast<char>(0x80);
  ExpectRejected(p, c, "padding bits of the last sign byte are 1; expected 0", 999);
}

// Builds a topk-style index prefix from raw varint bytes.
std::string Varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}

void ExpectAccepted(const v1::EncodedTensor& t, v1::Codec c) {
  std::vector<float> acc(kN, 0.0f);
  absl::Status s = MustMake(c)->DecodeAccumulate(t, 1.0f, absl::MakeSpan(acc));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CodecBadInput, TopKIndices) {
  for (v1::Codec c : {v1::CODEC_TOPK, v1::CODEC_TOPK_QUANTIZE}) {
    SCOPED_TRACE(CodecName(c));
    v1::CodecParams params;
    params.set_k(3);
    params.set_bits(8);
    v1::EncodedTensor t = EncodeWith(c, params);
    const std::string good = t.payload();
    uint64_t count = static_cast<uint8_t>(good[0]);
    ASSERT_EQ(count, 3u);
    // Values section of a 3-element payload (fp32 values or one quantize block).
    size_t gaps = 1;
    for (int j = 0; j < 3; ++j) while (static_cast<uint8_t>(good[gaps++]) & 0x80) {}
    const std::string values = good.substr(gaps);
    auto with = [&](const std::string& payload) {
      v1::EncodedTensor u = t;
      *u.mutable_payload() = payload;
      return u;
    };
    ExpectAccepted(with(Varint(3) + Varint(1) + Varint(2) + Varint(3) + values), c);
    ExpectRejected(with(""), c, "payload count varint is truncated");
    ExpectRejected(with(std::string(11, '\xff')), c, "payload count varint is over 64 bits");
    ExpectRejected(with(Varint(1001) + values), c,
                   "payload count is 1001; expected at most 1000");
    ExpectRejected(with(Varint(900) + values), c, "payload count is 900 but the payload is only");
    ExpectRejected(with(Varint(3) + Varint(1) + Varint(2)), c, "index gap 2 is truncated");
    ExpectRejected(with(Varint(3) + Varint(1) + std::string(10, '\xff') + "\x01" + values), c,
                   "index gap 1 is over 64 bits");
    ExpectRejected(with(Varint(3) + Varint(1000) + Varint(2) + Varint(3) + values), c,
                   "index 0 (gap 1000 after 0) is out of range; expected increasing indices below 1000");
    ExpectRejected(with(Varint(3) + Varint(1) + Varint(997) + Varint(0) + values), c,
                   "index 2 (gap 0 after 999) is out of range");
    // A gap that would wrap around 2^64 (a "decreasing" index).
    ExpectRejected(with(Varint(3) + Varint(5) + Varint(~uint64_t{0} - 3) + Varint(0) + values),
                   c, "index 1 (gap 18446744073709551612 after 5) is out of range");
    ExpectRejected(with(Varint(3) + Varint(1) + Varint(2) + Varint(3) + values + "x"), c,
                   c == v1::CODEC_TOPK ? "13 value bytes after the indices; expected 12"
                                       : "topk_quantize values payload is");
    ExpectRejected(with(Varint(3) + Varint(1) + Varint(2) + Varint(3) + values.substr(1)), c,
                   c == v1::CODEC_TOPK ? "11 value bytes" : "topk_quantize values payload is");
  }
}

TEST(CodecBadInput, TopKValues) {
  const v1::Codec c = v1::CODEC_TOPK;
  for (v1::ValueFormat f : {v1::VALUE_FORMAT_FP32, v1::VALUE_FORMAT_FP16}) {
    v1::CodecParams params;
    params.set_k(3);
    params.set_value_format(f);
    v1::EncodedTensor t = EncodeWith(c, params);
    v1::EncodedTensor u = t;
    std::string& p = *u.mutable_payload();
    p[p.size() - 1] = static_cast<char>(0x7f);
    p[p.size() - 2] = static_cast<char>(0xff);
    ExpectRejected(u, c, "topk value 2 is not finite");
    u = t;
    u.mutable_params()->set_value_format(static_cast<v1::ValueFormat>(5));
    ExpectRejected(u, c, "params.value_format is 5");
  }
}

TEST(CodecBadInput, RandomK) {
  const v1::Codec c = v1::CODEC_RANDOMK;
  v1::CodecParams params;
  params.set_k(10);
  v1::EncodedTensor t = EncodeWith(c, params);
  v1::EncodedTensor u = t;
  u.mutable_params()->set_k(1001);
  ExpectRejected(u, c, "params.k is 1001; expected at most 1000");
  u = t;
  u.mutable_params()->set_k(11);
  ExpectRejected(u, c, "payload is 40 bytes; expected 44 for k = 11 randomk values");
  u = t;
  u.mutable_payload()->pop_back();
  ExpectRejected(u, c, "payload is 39 bytes; expected 40");
  u = t;
  PutFloat(u.mutable_payload(), 4, NAN);
  ExpectRejected(u, c, "randomk value 1 is not finite");
  u = t;
  u.mutable_params()->set_value_format(v1::VALUE_FORMAT_FP16);
  ExpectRejected(u, c, "payload is 40 bytes; expected 20");
}

TEST(CodecBadInput, Quantize) {
  const v1::Codec c = v1::CODEC_QUANTIZE;
  v1::CodecParams params;
  params.set_bits(3);
  v1::EncodedTensor t = EncodeWith(c, params);
  // 4 blocks x (lo, hi) + ceil(3000 / 8) level bytes.
  ASSERT_EQ(t.payload().size(), 32u + 375);
  v1::EncodedTensor u = t;
  for (uint32_t bits : {0u, 1u, 9u, 32u}) {
    u = t;
    u.mutable_params()->set_bits(bits);
    ExpectRejected(u, c, absl::StrCat("params.bits is ", bits, "; expected 2..8"));
  }
  u = t;
  u.mutable_params()->set_range(static_cast<v1::QuantizeRange>(3));
  ExpectRejected(u, c, "params.range is 3");
  u = t;
  u.mutable_payload()->pop_back();
  ExpectRejected(u, c,
                 "quantize payload is 406 bytes; expected 407 for 1000 elements of 3 bits "
                 "with block 256 (linear range)");
  u = t;
  u.mutable_params()->set_range(v1::QUANTIZE_RANGE_ADAPTIVE);
  ExpectRejected(u, c, "expected 391 for 1000 elements of 3 bits with block 256 (adaptive");
  u = t;
  PutFloat(u.mutable_payload(), 8, INFINITY);
  ExpectRejected(u, c, "quantize block 1 range is [inf");
  u = t;
  PutFloat(u.mutable_payload(), 12, NAN);
  ExpectRejected(u, c, "quantize block 1 range is [");
  u = t;
  PutFloat(u.mutable_payload(), 16, 5.0f);
  PutFloat(u.mutable_payload(), 20, 4.0f);
  ExpectRejected(u, c, "quantize block 2 range is [5, 4]; expected finite lo <= hi");
  // 999 x 3 bits = 2997 bits: the top 3 bits of the last byte are padding.
  v1::EncodedTensor p = EncodeWith(c, params, 999);
  p.mutable_payload()->back() |= static_cast<char>(0x80);
  ExpectRejected(p, c, "padding bits of the last byte are 4; expected 0", 999);

  params.set_range(v1::QUANTIZE_RANGE_ADAPTIVE);
  v1::EncodedTensor a = EncodeWith(c, params);
  u = a;
  PutFloat(u.mutable_payload(), 4, -1.0f);
  ExpectRejected(u, c, "quantize block 1 clip is -1; expected a finite value >= 0");
  u = a;
  PutFloat(u.mutable_payload(), 0, NAN);
  ExpectRejected(u, c, "quantize block 0 clip is nan");
}

TEST(CodecBadInput, TopKQuantizeValues) {
  const v1::Codec c = v1::CODEC_TOPK_QUANTIZE;
  v1::CodecParams params;
  params.set_k(300);
  params.set_bits(4);
  v1::EncodedTensor t = EncodeWith(c, params);
  v1::EncodedTensor u = t;
  u.mutable_params()->set_bits(1);
  ExpectRejected(u, c, "params.bits is 1; expected 2..8");
  u = t;
  u.mutable_params()->set_block_size(100);  // 3 blocks instead of 2
  ExpectRejected(u, c, "topk_quantize values payload is");
}

TEST(CodecBadInput, BlockTopK) {
  const v1::Codec c = v1::CODEC_BLOCK_TOPK;
  // Rows of 100, blocks of 16: 7 blocks per row (the last one of 4), 70 in
  // all. Blocks 0, 1 and 6 hold 16 + 16 + 4 values.
  v1::CodecParams params;
  params.set_block_size(16);
  params.set_row_length(100);
  params.set_k(3);
  v1::EncodedTensor t = EncodeWith(c, params);
  ASSERT_EQ(t.params().row_length(), 100u);
  auto floats = [](size_t count) {
    std::string s;
    for (size_t i = 0; i < count; ++i) {
      const float v = 0.5f + static_cast<float>(i);
      s.append(reinterpret_cast<const char*>(&v), 4);
    }
    return s;
  };
  const std::string head = Varint(3) + Varint(0) + Varint(0) + Varint(4);
  auto with = [&](const std::string& payload) {
    v1::EncodedTensor u = t;
    *u.mutable_payload() = payload;
    return u;
  };
  ExpectAccepted(t, c);
  ExpectAccepted(with(head + floats(36)), c);
  ExpectAccepted(with(Varint(3) + Varint(0) + Varint(0) + Varint(0) + floats(48)), c);
  ExpectAccepted(with(Varint(0)), c);

  ExpectRejected(with(""), c, "payload count varint is truncated");
  ExpectRejected(with(Varint(71) + floats(4)), c,
                 "payload count is 71; expected at most 70 (blocks)");
  ExpectRejected(with(Varint(50) + "abc"), c, "payload count is 50 but the payload is only");
  ExpectRejected(with(Varint(3) + Varint(0) + Varint(0)), c, "index gap 2 is truncated");
  // Out of range: block 70 of 70.
  ExpectRejected(with(Varint(3) + Varint(0) + Varint(0) + Varint(68) + floats(36)), c,
                 "index 2 (gap 68 after 1) is out of range; expected increasing "
                 "indices below 70");
  // Gaps cannot say "repeat" or "go back" except by wrapping around 2^64.
  ExpectRejected(with(Varint(3) + Varint(5) + Varint(~uint64_t{0}) + Varint(0) + floats(36)),
                 c, "index 1 (gap 18446744073709551615 after 5) is out of range");
  ExpectRejected(with(head + floats(36).substr(1)), c,
                 "payload has 143 value bytes after the block indices; expected "
                 "144 for the 36 values of 3 blocks");
  ExpectRejected(with(head + floats(36) + "x"), c, "payload has 145 value bytes");
  ExpectRejected(with(head + floats(37)), c, "payload has 148 value bytes");
  // Blocks 0, 1, 2 are full: 48 values, not 36.
  ExpectRejected(with(Varint(3) + Varint(0) + Varint(0) + Varint(0) + floats(36)), c,
                 "expected 192 for the 48 values of 3 blocks");
  std::string nan = head + floats(36);
  PutFloat(&nan, nan.size() - 4, NAN);
  ExpectRejected(with(nan), c, "block_topk value 35 is not finite");
  PutFloat(&nan, nan.size() - 4, -INFINITY);
  ExpectRejected(with(nan), c, "block_topk value 35 is not finite");

  // fp16 values: 2 bytes each; 0x7c00 is +Inf.
  v1::EncodedTensor h = with(head + std::string(72, '\x3c'));
  h.mutable_params()->set_value_format(v1::VALUE_FORMAT_FP16);
  ExpectAccepted(h, c);
  (*h.mutable_payload())[head.size() + 5] = static_cast<char>(0x7c);
  (*h.mutable_payload())[head.size() + 4] = 0;
  ExpectRejected(h, c, "block_topk value 2 is not finite");
  h.mutable_params()->set_value_format(static_cast<v1::ValueFormat>(5));
  ExpectRejected(h, c, "params.value_format is 5");

  // The layout fields, read from the tensor.
  for (uint32_t b : {0u, 3u, 65u, 256u}) {
    v1::EncodedTensor u = t;
    u.mutable_params()->set_block_size(b);
    ExpectRejected(u, c, absl::StrCat("params.block_size is ", b,
                                      "; expected 4..64 for block_topk"));
  }
  v1::EncodedTensor u = with(head + floats(36));
  u.mutable_params()->set_block_size(8);  // 13 blocks per row: 8 + 8 + 8
  ExpectRejected(u, c, "expected 96 for the 24 values of 3 blocks");
  for (uint64_t row : {uint64_t{30}, uint64_t{2000}}) {
    u = t;
    u.mutable_params()->set_row_length(row);
    ExpectRejected(u, c, absl::StrCat("params.row_length is ", row,
                                      "; expected 0 (flat) or a divisor of "
                                      "num_elements 1000"));
  }
  u = t;
  u.mutable_params()->set_row_length(uint64_t{1} << 40);
  ExpectRejected(u, c, "params.row_length is 1099511627776; expected 0 (flat) or ");
  // Flat instead of rows: block 6 is then a full block.
  u = with(head + floats(36));
  u.mutable_params()->set_row_length(0);
  ExpectRejected(u, c, "expected 192 for the 48 values of 3 blocks");
}

// Random corruption of valid tensors of every codec: never a crash; a
// rejection leaves acc unchanged; an acceptance decodes to finite values.
TEST(CodecBadInput, RandomCorruptionNeverCrashes) {
  std::mt19937 rng(1234);
  for (const auto& c : AllCodecCases()) {
    SCOPED_TRACE(c.name);
    v1::EncodedTensor t = EncodeWith(c.codec, c.params, 300);
    for (int trial = 0; trial < 2000; ++trial) {
      v1::EncodedTensor u = t;
      std::string& p = *u.mutable_payload();
      switch (trial % 4) {
        case 0:
          if (!p.empty()) p[rng() % p.size()] ^= static_cast<char>(1 << (rng() % 8));
          break;
        case 1:
          p.resize(rng() % (p.size() + 1));
          break;
        case 2:
          p.append(rng() % 9, static_cast<char>(rng()));
          break;
        default:
          for (int j = 0; j < 4 && !p.empty(); ++j) p[rng() % p.size()] = static_cast<char>(rng());
          break;
      }
      std::vector<float> acc(300, 1.0f);
      const Codec* dec = DecoderFor(u.codec());
      ASSERT_NE(dec, nullptr);
      absl::Status s = dec->DecodeAccumulate(u, 1.0f, absl::MakeSpan(acc));
      absl::StatusOr<ValidatedTensor> v = ValidateTensor(u, 300);
      ASSERT_EQ(v.ok(), s.ok()) << s << " vs " << v.status();
      if (s.ok()) {
        for (float x : acc) ASSERT_TRUE(std::isfinite(x));
        std::vector<float> again(300, 1.0f);
        v->AccumulateInto(1.0f, absl::MakeSpan(again));
        ASSERT_EQ(0, std::memcmp(again.data(), acc.data(), 300 * 4));
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        ASSERT_EQ(v.status(), s);
        for (float x : acc) ASSERT_EQ(x, 1.0f);
      }
    }
  }
}

}  // namespace
}  // namespace pserver
