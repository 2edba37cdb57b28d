// Encoding, encoding with error feedback and decoding allocate nothing once
// warm (issue 10: reused workspaces instead of per-call vectors). This binary
// replaces the global operator new to count allocations made by the thread
// under test, so it holds only these tests.
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/internal/cpu.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace {
thread_local bool counting = false;
thread_local size_t allocations = 0;
}  // namespace

// Not inlined: GCC would otherwise pair the free() below with the new
// expressions it sees and warn (-Wmismatched-new-delete).
__attribute__((noinline)) void* operator new(size_t size) {
  if (counting) ++allocations;
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
__attribute__((noinline)) void operator delete(void* p) noexcept {
  std::free(p);
}
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

namespace pserver {
namespace {

using testing_util::AllCodecCases;
using testing_util::CaseName;
using testing_util::CodecCase;
using testing_util::MustMake;
using testing_util::RandomVector;

// Allocations made by the calling thread while f runs.
template <typename F>
size_t CountAllocations(F f) {
  allocations = 0;
  counting = true;
  f();
  counting = false;
  return allocations;
}

class SteadyState : public ::testing::TestWithParam<CodecCase> {};

TEST_P(SteadyState, NoAllocationPerCallOnceWarm) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  // Small, and large enough for sampled topk selection.
  for (size_t n : {size_t{1000}, size_t{1} << 17}) {
    for (bool scalar : {false, true}) {
      SCOPED_TRACE(::testing::Message() << n << " " << scalar);
      internal::ForceScalarKernelsForTesting(scalar);
      std::vector<float> g = RandomVector(n, 1), e = RandomVector(n, 2, 0.3f);
      std::vector<float> e_out(n), acc(n, 0.0f);
      v1::EncodedTensor t, t_ef;
      auto round = [&](uint64_t seed) {
        EXPECT_TRUE(codec->Encode(g, seed, &t).ok());
        EXPECT_TRUE(EncodeWithFeedback(*codec, g, e, 0.9f, seed, &t_ef,
                                       absl::MakeSpan(e_out))
                        .ok());
        EXPECT_TRUE(codec->DecodeAccumulate(t, 0.5f, absl::MakeSpan(acc)).ok());
        EXPECT_TRUE(
            codec->DecodeAccumulate(t_ef, 0.5f, absl::MakeSpan(acc)).ok());
      };
      round(1);  // warm: workspaces and payload strings grow here
      round(2);
      EXPECT_EQ(CountAllocations([&] { round(3); }), 0u);
      internal::ForceScalarKernelsForTesting(false);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, SteadyState,
                         ::testing::ValuesIn(AllCodecCases()), CaseName);

// The counter works: a vector allocates.
TEST(CodecAllocations, CounterSeesAllocations) {
  EXPECT_EQ(CountAllocations([] { std::vector<int> v(10); (void)v; }), 1u);
}

}  // namespace
}  // namespace pserver
