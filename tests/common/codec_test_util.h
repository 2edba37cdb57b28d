// Helpers shared by the codec tests.
#ifndef PSERVER_TESTS_COMMON_CODEC_TEST_UTIL_H_
#define PSERVER_TESTS_COMMON_CODEC_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/codec.h"
#include "gtest/gtest.h"

namespace pserver {
namespace testing_util {

// Gaussian values with a fixed seed (test data only).
inline std::vector<float> RandomVector(size_t n, uint32_t seed,
                                       float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::unique_ptr<Codec> MustMake(v1::Codec c,
                                       const v1::CodecParams& p = {}) {
  auto codec = MakeCodec(c, p);
  EXPECT_TRUE(codec.ok()) << codec.status();
  return codec.ok() ? std::move(*codec) : nullptr;
}

// One named configuration per codec and interesting option.
struct CodecCase {
  std::string name;
  v1::Codec codec;
  v1::CodecParams params;
};

inline std::vector<CodecCase> AllCodecCases() {
  std::vector<CodecCase> cases;
  auto add = [&](std::string name, v1::Codec c, v1::CodecParams p) {
    cases.push_back({std::move(name), c, std::move(p)});
  };
  v1::CodecParams p;
  add("fp32", v1::CODEC_FP32, p);
  add("fp16", v1::CODEC_FP16, p);
  add("bf16", v1::CODEC_BF16, p);
  add("onebit", v1::CODEC_ONEBIT, p);
  p.set_scale_mode(v1::SCALE_MODE_L2);
  p.set_block_size(100);
  add("onebit_l2_block100", v1::CODEC_ONEBIT, p);
  p = {};
  p.set_k_fraction(0.1);
  add("topk", v1::CODEC_TOPK, p);
  p.set_selection(v1::TOPK_SELECTION_EXACT);
  p.set_value_format(v1::VALUE_FORMAT_FP16);
  add("topk_exact_fp16", v1::CODEC_TOPK, p);
  p = {};
  p.set_k_fraction(0.25);
  add("randomk", v1::CODEC_RANDOMK, p);
  p.set_unbiased(true);
  p.set_k_fraction(0.5);
  add("randomk_unbiased", v1::CODEC_RANDOMK, p);
  p = {};
  p.set_bits(4);
  add("quantize4", v1::CODEC_QUANTIZE, p);
  p.set_rounding(v1::ROUNDING_STOCHASTIC);
  p.set_range(v1::QUANTIZE_RANGE_ADAPTIVE);
  p.set_block_size(100);
  add("quantize4_adaptive_stochastic", v1::CODEC_QUANTIZE, p);
  p = {};
  p.set_k_fraction(0.2);
  p.set_bits(6);
  add("topk_quantize", v1::CODEC_TOPK_QUANTIZE, p);
  p = {};
  p.set_k_fraction(0.1);
  add("block_topk", v1::CODEC_BLOCK_TOPK, p);
  // Rows of 8 when they divide the size (blocks of 5 and 3), else flat.
  p.set_block_size(5);
  p.set_row_length(8);
  p.set_value_format(v1::VALUE_FORMAT_FP16);
  p.set_k_fraction(0.3);
  add("block_topk_b5_rows8_fp16", v1::CODEC_BLOCK_TOPK, p);
  return cases;
}

inline std::string CaseName(const ::testing::TestParamInfo<CodecCase>& i) {
  return i.param.name;
}

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_COMMON_CODEC_TEST_UTIL_H_
