// Codecs are thread-safe (codec.h); the ones with reusable workspaces
// (topk, topk_quantize, randomk, adaptive quantize: common/impl/scratch.h)
// must give every concurrent caller its own. Several threads encode, encode
// with error feedback and decode through one codec object and one shared
// decoder, and must get what one thread alone gets.
#include <string>
#include <thread>
#include <vector>

#include "common/codec.h"
#include "common/error_feedback.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::AllCodecCases;
using testing_util::CaseName;
using testing_util::CodecCase;
using testing_util::MustMake;
using testing_util::RandomVector;

// What one call of each kind gives for input number i.
struct Result {
  std::string encoded, fed_back;
  std::vector<float> residual, decoded;
};

Result RunOnce(const Codec& codec, size_t n, int i) {
  Result r;
  std::vector<float> g = RandomVector(n, 100 + i), e = RandomVector(n, 200 + i);
  v1::EncodedTensor t;
  EXPECT_TRUE(codec.Encode(g, i, &t).ok());
  r.encoded = t.SerializeAsString();
  r.decoded.assign(n, 0.0f);
  EXPECT_TRUE(DecoderFor(codec.id())
                  ->DecodeAccumulate(t, 1.0f, absl::MakeSpan(r.decoded))
                  .ok());
  r.residual.assign(n, 0.0f);
  EXPECT_TRUE(EncodeWithFeedback(codec, g, e, 0.5f, i, &t,
                                 absl::MakeSpan(r.residual))
                  .ok());
  r.fed_back = t.SerializeAsString();
  return r;
}

class Concurrent : public ::testing::TestWithParam<CodecCase> {};

TEST_P(Concurrent, ThreadsSharingOneCodecGetWhatOneThreadGets) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  constexpr int kThreads = 4, kCalls = 3;
  for (size_t n : {size_t{3000}, size_t{1} << 16}) {
    std::vector<Result> want;
    for (int i = 0; i < kThreads * kCalls; ++i) {
      want.push_back(RunOnce(*codec, n, i));
    }
    std::vector<std::vector<Result>> got(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int c = 0; c < kCalls; ++c) {
          got[t].push_back(RunOnce(*codec, n, t * kCalls + c));
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
      for (int c = 0; c < kCalls; ++c) {
        const Result& a = got[t][c];
        const Result& b = want[t * kCalls + c];
        SCOPED_TRACE(::testing::Message() << n << " " << t << " " << c);
        EXPECT_EQ(a.encoded, b.encoded);
        EXPECT_EQ(a.fed_back, b.fed_back);
        EXPECT_EQ(a.residual, b.residual);
        EXPECT_EQ(a.decoded, b.decoded);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Concurrent,
                         ::testing::ValuesIn(AllCodecCases()), CaseName);

}  // namespace
}  // namespace pserver
