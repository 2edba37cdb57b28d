#include <cmath>
#include <cstring>
#include <vector>

#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/internal/cpu.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::MustMake;
using testing_util::RandomVector;

// Slow reference: per block, scale in double, sign bit i at byte i/8 bit i%8.
struct RefOneBit {
  std::vector<double> scales;
  std::vector<uint8_t> signs;
};

RefOneBit ReferenceEncode(const std::vector<float>& u, size_t block, bool l2) {
  RefOneBit r;
  size_t n = u.size();
  if (block == 0 || block > n) block = n;
  for (size_t b0 = 0; b0 < n; b0 += block) {
    size_t len = std::min(block, n - b0);
    double s = 0;
    for (size_t j = 0; j < len; ++j) {
      double x = u[b0 + j];
      s += l2 ? x * x : std::fabs(x);
    }
    r.scales.push_back(l2 ? std::sqrt(s / len) : s / len);
  }
  r.signs.assign((n + 7) / 8, 0);
  for (size_t i = 0; i < n; ++i) {
    if (u[i] >= 0) r.signs[i / 8] |= 1 << (i % 8);
  }
  return r;
}

v1::CodecParams Params(uint32_t block, bool l2) {
  v1::CodecParams p;
  p.set_block_size(block);
  if (l2) p.set_scale_mode(v1::SCALE_MODE_L2);
  return p;
}

// block_size 0 means one block only inside a tensor; MakeCodec maps 0 to the
// default 256, so a whole-tensor encoder passes a block >= n.
constexpr uint32_t kWhole = 0xffffffffu;

TEST(OneBitCodec, MatchesReference) {
  for (uint32_t block : {256u, 8u, 100u, 1u, kWhole}) {
    for (bool l2 : {false, true}) {
      for (size_t n : {1, 7, 255, 256, 257, 1000, 4097}) {
        SCOPED_TRACE(::testing::Message() << block << " " << l2 << " " << n);
        std::vector<float> u = RandomVector(n, static_cast<uint32_t>(n + block));
        auto codec = MustMake(v1::CODEC_ONEBIT, Params(block, l2));
        v1::EncodedTensor t;
        ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
        RefOneBit ref = ReferenceEncode(u, block == kWhole ? 0 : block, l2);
        ASSERT_EQ(t.payload().size(), ref.scales.size() * 4 + ref.signs.size());
        std::vector<float> scales(ref.scales.size());
        std::memcpy(scales.data(), t.payload().data(), scales.size() * 4);
        for (size_t b = 0; b < scales.size(); ++b) {
          ASSERT_NEAR(scales[b], ref.scales[b], 1e-5 * ref.scales[b]) << b;
        }
        std::vector<uint8_t> signs(t.payload().begin() + scales.size() * 4,
                                   t.payload().end());
        ASSERT_EQ(signs, ref.signs);
        std::vector<float> d(n);
        ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
        size_t bl = block == kWhole || block > n ? n : block;
        for (size_t i = 0; i < n; ++i) {
          float s = scales[i / bl];
          ASSERT_EQ(d[i], u[i] >= 0 ? s : -s) << i;
        }
      }
    }
  }
}

TEST(OneBitCodec, PayloadLayout) {
  auto codec = MustMake(v1::CODEC_ONEBIT);
  std::vector<float> u = {1.0f, -3.0f, 0.0f, -0.0f, 2.0f};
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
  ASSERT_EQ(t.payload().size(), 4u + 1u);
  float scale;
  std::memcpy(&scale, t.payload().data(), 4);
  EXPECT_FLOAT_EQ(scale, 6.0f / 5.0f);
  // LSB-first; zero (also -0) encodes as 1; padding bits 0.
  EXPECT_EQ(static_cast<uint8_t>(t.payload()[4]), 0b11101);
  EXPECT_EQ(t.params().block_size(), 256u);
}

TEST(OneBitCodec, ZeroBlockDecodesToZerosNextToNonZeroBlock) {
  auto codec = MustMake(v1::CODEC_ONEBIT, Params(16, false));
  std::vector<float> u = RandomVector(48, 1);
  for (size_t i = 16; i < 32; ++i) u[i] = 0.0f;
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
  std::vector<float> d(48);
  ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
  for (size_t i = 16; i < 32; ++i) EXPECT_EQ(d[i], 0.0f);
  EXPECT_NE(d[0], 0.0f);
  EXPECT_NE(d[40], 0.0f);
}

TEST(OneBitCodec, WholeTensorBlockInPayloadParams) {
  // A tensor whose params say block_size 0 has one scale for everything.
  std::vector<float> u = RandomVector(1000, 3);
  v1::EncodedTensor t;
  auto whole = MustMake(v1::CODEC_ONEBIT, Params(kWhole, false));
  ASSERT_TRUE(whole->Encode(u, 0, &t).ok());
  ASSERT_EQ(t.payload().size(), 4u + 125u);
  t.mutable_params()->set_block_size(0);
  auto codec = MustMake(v1::CODEC_ONEBIT);
  std::vector<float> d(1000);
  ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
  float s;
  std::memcpy(&s, t.payload().data(), 4);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(std::fabs(d[i]), s);
}

class ScalarPath {
 public:
  ScalarPath() { internal::ForceScalarKernelsForTesting(true); }
  ~ScalarPath() { internal::ForceScalarKernelsForTesting(false); }
};

TEST(OneBitCodec, Avx2AndScalarKernelsAreBitIdentical) {
  if (!internal::UseAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (uint32_t block : {256u, 8u, 64u, 1024u, kWhole}) {
    for (bool l2 : {false, true}) {
      for (size_t n : {0, 1, 7, 9, 255, 256, 257, 1000, 4097, 65536 + 3}) {
        SCOPED_TRACE(::testing::Message() << block << " " << l2 << " " << n);
        auto codec = MustMake(v1::CODEC_ONEBIT, Params(block, l2));
        std::vector<float> g = RandomVector(n, 1), e = RandomVector(n, 2, 0.1f);
        if (n > 20) {
          for (size_t i = 0; i < 8; ++i) g[i] = 0.0f, e[i] = 0.0f;
          g[9] = -0.0f;
          g[17] = 3e38f;  // forces the double fallback in its block
        }
        std::vector<float> e1(n), e2(n), acc1 = RandomVector(n, 3), acc2 = acc1;
        v1::EncodedTensor t1, t2, p1, p2;
        ASSERT_TRUE(EncodeWithFeedback(*codec, g, e, 0.9f, 0, &t1, absl::MakeSpan(e1)).ok());
        ASSERT_TRUE(codec->Encode(g, 0, &p1).ok());
        ASSERT_TRUE(codec->DecodeAccumulate(t1, -0.3f, absl::MakeSpan(acc1)).ok());
        {
          ScalarPath scalar;
          ASSERT_TRUE(EncodeWithFeedback(*codec, g, e, 0.9f, 0, &t2, absl::MakeSpan(e2)).ok());
          ASSERT_TRUE(codec->Encode(g, 0, &p2).ok());
          ASSERT_TRUE(codec->DecodeAccumulate(t2, -0.3f, absl::MakeSpan(acc2)).ok());
        }
        ASSERT_EQ(t1.payload(), t2.payload());
        ASSERT_EQ(p1.payload(), p2.payload());
        // n may be 0: memcmp of an empty vector's null data() is UB.
        ASSERT_TRUE(n == 0 || std::memcmp(e1.data(), e2.data(), n * 4) == 0);
        ASSERT_TRUE(n == 0 || std::memcmp(acc1.data(), acc2.data(), n * 4) == 0);
      }
    }
  }
}

// Residuals of large calls (16 MiB and up) leave the AVX2 kernel through
// non-temporal stores when e_out is 16-byte aligned, and through ordinary
// stores otherwise; both must be the scalar kernel's bytes.
TEST(OneBitCodec, LargeCallsMatchScalarKernelWhateverTheAlignment) {
  if (!internal::UseAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  const size_t n = (size_t{1} << 22) + 13;
  std::vector<float> g = RandomVector(n, 5), e = RandomVector(n, 6, 0.1f);
  g[1000] = 3e38f;  // one block takes the double fallback
  for (uint32_t block : {256u, 4096u}) {
    auto codec = MustMake(v1::CODEC_ONEBIT, Params(block, false));
    // offset 0: vector storage, 16-byte aligned; offset 1: 4 bytes off.
    for (size_t offset : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << block << " " << offset);
      std::vector<float> out1(n + 1, 7.0f), out2(n + 1, 7.0f);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(out1.data()) % 16, 0u);
      v1::EncodedTensor t1, t2;
      ASSERT_TRUE(EncodeWithFeedback(*codec, g, e, 0.9f, 0, &t1,
                                     absl::MakeSpan(out1).subspan(offset, n))
                      .ok());
      {
        ScalarPath scalar;
        ASSERT_TRUE(EncodeWithFeedback(*codec, g, e, 0.9f, 0, &t2,
                                       absl::MakeSpan(out2).subspan(offset, n))
                        .ok());
      }
      ASSERT_EQ(t1.payload(), t2.payload());
      ASSERT_EQ(0, std::memcmp(out1.data(), out2.data(), (n + 1) * 4));
    }
  }
}

TEST(OneBitCodec, ScalarPathRejectsNonFiniteLikeAvx2) {
  ScalarPath scalar;
  auto codec = MustMake(v1::CODEC_ONEBIT);
  std::vector<float> u = RandomVector(600, 4);
  u[300] = NAN;
  v1::EncodedTensor t;
  absl::Status s = codec->Encode(u, 0, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("element 300 "), std::string::npos) << s;
}

}  // namespace
}  // namespace pserver
