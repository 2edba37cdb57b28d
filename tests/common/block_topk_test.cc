// block_topk against a slow reference written from codec.proto's layout:
// blocks listed one by one, norms summed in double, a stable sort for the
// top k, the payload assembled byte by byte.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/internal/float16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::MustMake;
using testing_util::RandomVector;
using ::testing::HasSubstr;

struct Block {
  uint64_t start;
  uint64_t length;
};

// The blocks of n elements: rows of row_length when it divides n, else one
// row; each row cut into pieces of `block` from its start.
std::vector<Block> ReferenceBlocks(uint64_t n, uint64_t block,
                                   uint64_t row_length) {
  uint64_t row = n;
  if (row_length != 0 && row_length <= n && n % row_length == 0) {
    row = row_length;
  }
  std::vector<Block> blocks;
  for (uint64_t r = 0; r < n; r += row) {
    for (uint64_t off = 0; off < row; off += block) {
      blocks.push_back({r + off, std::min(block, row - off)});
    }
  }
  return blocks;
}

std::string Varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}

struct Reference {
  std::vector<uint64_t> chosen;  // block numbers, increasing
  std::vector<float> decoded;
  std::string payload;
};

// The k blocks of largest sum of squares (ties: lower block first).
Reference ReferenceBlockTopK(const std::vector<float>& u, uint64_t block,
                             uint64_t row_length, uint64_t k, bool fp16) {
  const std::vector<Block> blocks =
      ReferenceBlocks(u.size(), block, row_length);
  std::vector<double> norm(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    double sum = 0.0;
    for (uint64_t i = 0; i < blocks[b].length; ++i) {
      const double x = u[blocks[b].start + i];
      sum += x * x;
    }
    norm[b] = sum;
  }
  std::vector<uint64_t> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint64_t a, uint64_t b) { return norm[a] > norm[b]; });
  Reference r;
  r.chosen.assign(order.begin(), order.begin() + std::min<uint64_t>(k, order.size()));
  std::sort(r.chosen.begin(), r.chosen.end());
  r.decoded.assign(u.size(), 0.0f);
  r.payload = Varint(r.chosen.size());
  for (size_t j = 0; j < r.chosen.size(); ++j) {
    r.payload += Varint(j == 0 ? r.chosen[0] : r.chosen[j] - r.chosen[j - 1] - 1);
  }
  for (uint64_t b : r.chosen) {
    for (uint64_t i = 0; i < blocks[b].length; ++i) {
      const uint64_t at = blocks[b].start + i;
      if (fp16) {
        const uint16_t h = internal::FloatToHalf(u[at]);
        r.payload.append(reinterpret_cast<const char*>(&h), 2);
        r.decoded[at] = internal::HalfToFloat(h);
      } else {
        r.payload.append(reinterpret_cast<const char*>(&u[at]), 4);
        r.decoded[at] = u[at];
      }
    }
  }
  return r;
}

v1::CodecParams Params(uint32_t block, uint64_t row_length, uint64_t k,
                       bool fp16) {
  v1::CodecParams p;
  p.set_block_size(block);
  p.set_row_length(row_length);
  p.set_k(k);
  if (fp16) p.set_value_format(v1::VALUE_FORMAT_FP16);
  return p;
}

TEST(BlockTopKCodec, MatchesReferenceOverBlockSizesRowsTiesAndK) {
  for (size_t n : {1, 3, 4, 17, 100, 360, 1000, 4097}) {
    for (uint32_t block : {4u, 5u, 16u, 64u}) {
      // Flat, rows that divide n (with and without short blocks), a row that
      // does not divide n (flat instead), the whole span as one row.
      for (uint64_t row : {uint64_t{0}, uint64_t{10}, uint64_t{20},
                           uint64_t{7}, uint64_t{n}}) {
        for (int data = 0; data < 3; ++data) {
          std::vector<float> u = RandomVector(n, static_cast<uint32_t>(n + block));
          if (data == 1) {  // few distinct norms: many ties
            for (float& x : u) x = x > 0.5f ? 1.0f : (x < -0.5f ? -1.0f : 0.0f);
          } else if (data == 2) {
            std::fill(u.begin(), u.end(), 0.0f);  // all blocks tie
          }
          const size_t blocks = ReferenceBlocks(n, block, row).size();
          for (uint64_t k : {uint64_t{1}, uint64_t{blocks / 3 + 1},
                             uint64_t{blocks}, uint64_t{blocks + 5}}) {
            for (bool fp16 : {false, true}) {
              SCOPED_TRACE(::testing::Message()
                           << "n " << n << " block " << block << " row " << row
                           << " data " << data << " k " << k << " fp16 " << fp16);
              auto codec = MustMake(v1::CODEC_BLOCK_TOPK,
                                    Params(block, row, k, fp16));
              v1::EncodedTensor t;
              ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
              const Reference want = ReferenceBlockTopK(u, block, row, k, fp16);
              EXPECT_EQ(t.params().k(), want.chosen.size());
              EXPECT_EQ(t.params().block_size(), block);
              const bool divides = row != 0 && n % row == 0;
              EXPECT_EQ(t.params().row_length(), divides ? row : 0);
              ASSERT_EQ(t.payload(), want.payload);
              std::vector<float> d(n, 7.0f);
              ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
              ASSERT_EQ(d, want.decoded);
            }
          }
        }
      }
    }
  }
}

TEST(BlockTopKCodec, KCountsBlocksAndTheFractionRoundsUp) {
  std::vector<float> u = RandomVector(1600, 4);  // 100 blocks of 16
  struct Case {
    uint64_t k;
    double fraction;
    uint64_t blocks;
  };
  for (const Case& c : {Case{3, 0, 3}, Case{1000, 0, 100}, Case{0, 0.07, 7},
                        Case{0, 0.071, 8}, Case{0, 0.001, 1}, Case{0, 1.0, 100},
                        Case{0, 0, 1} /* default fraction 0.01 */}) {
    SCOPED_TRACE(::testing::Message() << c.k << " " << c.fraction);
    v1::CodecParams p;
    p.set_k(c.k);
    p.set_k_fraction(c.fraction);
    auto codec = MustMake(v1::CODEC_BLOCK_TOPK, p);
    EXPECT_EQ(codec->params().block_size(), 16u);  // the default
    v1::EncodedTensor t;
    ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
    EXPECT_EQ(t.params().k(), c.blocks);
    std::vector<float> d(u.size());
    ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
    EXPECT_EQ(std::count_if(d.begin(), d.end(), [](float x) { return x != 0; }),
              static_cast<std::ptrdiff_t>(c.blocks * 16));
  }
}

TEST(BlockTopKCodec, BlocksNeverCrossARowBoundary) {
  // Rows of 10, blocks of 4: [0,4) [4,8) [8,10) in each row. The two large
  // pairs 8..9 and 10..11 would share one block over the flat span.
  std::vector<float> u(40, 0.01f);
  u[8] = u[9] = u[10] = u[11] = 5.0f;
  v1::CodecParams p = Params(4, 10, 1, false);
  auto codec = MustMake(v1::CODEC_BLOCK_TOPK, p);
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
  std::vector<float> d(40);
  ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
  std::vector<float> want(40, 0.0f);
  // Row 1's first block [10,14) has 50.0002 > row 0's [8,10) at 50.
  want[10] = want[11] = 5.0f;
  want[12] = want[13] = 0.01f;
  EXPECT_EQ(d, want);
  // Flat, the block [8,12) holds all four.
  auto flat = MustMake(v1::CODEC_BLOCK_TOPK, Params(4, 0, 1, false));
  ASSERT_TRUE(flat->Encode(u, 0, &t).ok());
  ASSERT_TRUE(flat->Decode(t, absl::MakeSpan(d)).ok());
  std::fill(want.begin(), want.end(), 0.0f);
  want[8] = want[9] = want[10] = want[11] = 5.0f;
  EXPECT_EQ(d, want);
}

TEST(BlockTopKCodec, ErrorFeedbackResidualIsInputMinusDecoded) {
  for (bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16);
    v1::CodecParams p = Params(8, 100, 0, fp16);
    p.set_k_fraction(0.2);
    auto codec = MustMake(v1::CODEC_BLOCK_TOPK, p);
    ErrorFeedback ef(codec.get(), 1000);
    std::vector<float> e(1000, 0.0f), sent(1000, 0.0f), total(1000, 0.0f);
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g = RandomVector(1000, 10 + step);
      v1::EncodedTensor t;
      ASSERT_TRUE(ef.Encode(g, step, &t).ok());
      // 10 rows of 12 blocks of 8 and one of 4: 0.2 of 130 blocks.
      EXPECT_EQ(t.params().k(), 26u);
      std::vector<float> d(1000);
      ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
      for (size_t i = 0; i < 1000; ++i) {
        const float u = g[i] + e[i];
        ASSERT_EQ(ef.residual()[i], u - d[i]) << step << " " << i;
        e[i] = ef.residual()[i];
        sent[i] += d[i];
        total[i] += g[i];
      }
    }
    // Delayed, not lost: what was sent plus the residual is the input.
    for (size_t i = 0; i < 1000; ++i) {
      ASSERT_NEAR(sent[i] + e[i], total[i], 1e-4) << i;
    }
  }
}

// The fused kernel forms u a tile (about 4096 elements) at a time: rows
// longer than a tile, with short blocks, must come out bit for bit as
// encode-then-decode does.
TEST(BlockTopKCodec, FusedFeedbackMatchesEncodeThenDecodeOverLongRows) {
  for (uint32_t block : {4u, 7u, 64u}) {
    for (uint64_t row : {uint64_t{0}, uint64_t{10000}, uint64_t{4095}}) {
      for (bool fp16 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << block << " " << row << " " << fp16);
        v1::CodecParams p = Params(block, row, 0, fp16);
        p.set_k_fraction(0.05);
        auto codec = MustMake(v1::CODEC_BLOCK_TOPK, p);
        ASSERT_NE(codec->fused_feedback(), nullptr);
        const size_t n = row == 0 ? 30001 : 3 * row;
        std::vector<float> g = RandomVector(n, block), e = RandomVector(n, 5, 0.5f);
        std::vector<float> e_out(n, -1.0f);
        v1::EncodedTensor fused, plain;
        ASSERT_TRUE(EncodeWithFeedback(*codec, g, e, 0.9f, 1, &fused,
                                       absl::MakeSpan(e_out))
                        .ok());
        std::vector<float> u(n), d(n);
        for (size_t i = 0; i < n; ++i) {
          const float decayed = 0.9f * e[i];
          u[i] = g[i] + decayed;
        }
        ASSERT_TRUE(codec->Encode(u, 1, &plain).ok());
        EXPECT_EQ(fused.SerializeAsString(), plain.SerializeAsString());
        ASSERT_TRUE(codec->Decode(plain, absl::MakeSpan(d)).ok());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(e_out[i], u[i] - d[i]) << i;
      }
    }
  }
}

TEST(BlockTopKCodec, ParamsOutOfRangeAreRefusedNamingTheField) {
  struct Case {
    uint32_t block;
    uint64_t row;
    const char* message;
  };
  for (const Case& c :
       {Case{3, 0, "params.block_size is 3; expected 4..64 for block_topk"},
        Case{65, 0, "params.block_size is 65; expected 4..64 for block_topk"},
        Case{256, 0, "params.block_size is 256; expected 4..64 for block_topk"},
        Case{16, (uint64_t{1} << 29) + 1,
             "params.row_length is 536870913; expected 0 (flat) or 1..536870912"}}) {
    v1::CodecParams p;
    p.set_block_size(c.block);
    p.set_row_length(c.row);
    auto codec = MakeCodec(v1::CODEC_BLOCK_TOPK, p);
    ASSERT_FALSE(codec.ok()) << c.message;
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(codec.status().message()), HasSubstr(c.message));
  }
  // block_size is the other codecs' field too: 256 stays fine for them.
  v1::CodecParams p;
  p.set_block_size(256);
  EXPECT_TRUE(MakeCodec(v1::CODEC_ONEBIT, p).ok());
  p.set_block_size(64);
  p.set_row_length(uint64_t{1} << 29);
  EXPECT_TRUE(MakeCodec(v1::CODEC_BLOCK_TOPK, p).ok());
}

TEST(BlockTopKCodec, NonFiniteInputNamesTheFirstElement) {
  auto codec = MustMake(v1::CODEC_BLOCK_TOPK, Params(16, 32, 2, false));
  std::vector<float> u = RandomVector(320, 3);
  u[37] = -INFINITY;
  u[200] = NAN;
  v1::EncodedTensor t;
  absl::Status s = codec->Encode(u, 0, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input element 37 is Inf"));
}

}  // namespace
}  // namespace pserver
