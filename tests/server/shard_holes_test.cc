// Regression tests for the holes issue 9 found in the shard, one test (or
// group) per hole, named after it.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "common/thread_pool.h"
#include "common/validated_tensor.h"
#include "gtest/gtest.h"
#include "server/round.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/proc_status.h"

namespace pserver {
namespace {

using testing_util::RssKb;

using testing_util::DecodeAll;
using testing_util::ExactSgdConfig;
using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;

v1::ModelLayout OneTensor(uint64_t n) {
  v1::ModelLayout l;
  v1::TensorSpec* t = l.add_tensors();
  t->set_name("big");
  t->add_shape(static_cast<int64_t>(n));
  return l;
}


std::unique_ptr<Shard> MakeShard(const ShardConfig& c) {
  auto s = Shard::Create(c, nullptr);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

bool Has(const absl::Status& s, const std::string& what) {
  return s.message().find(what) != absl::string_view::npos;
}

// Registers every worker with SmallLayout and runs `rounds` rounds.
void RunRounds(Shard& s, uint32_t workers, uint64_t first, uint64_t rounds) {
  for (uint64_t step = first; step < first + rounds; ++step) {
    for (uint32_t w = 0; w < workers; ++w) {
      ASSERT_TRUE(
          s.Push(PushRequestFor(w, step, Fp32Tensor(Gradient(kSmallElements, w, step))))
              .ok());
    }
  }
}

// ---------------------------------------------------------------------------
// Hole 1: a few-byte Register made the shard allocate x, x_hat, the sum, m
// and v for the whole layout (40 MB for 31 bytes at 2^21 elements). Only
// fp32 initial weights of exactly the slice's size are accepted, checked
// before anything is allocated.

TEST(ShardHoles, Hole1TinyRegisterCannotBuyMemory) {
  // 2^24 elements: the old behaviour allocated 5 x 64 MiB here.
  constexpr uint64_t kN = uint64_t{1} << 24;
  ShardConfig c = testing_util::OneBitAdamConfig(1, 10);
  auto shard = MakeShard(c);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;

  std::vector<v1::RegisterRequest> tiny;
  auto base = [&] {
    v1::RegisterRequest r;
    r.set_worker_id(0);
    r.set_num_workers(1);
    r.set_num_shards(1);
    *r.mutable_layout() = OneTensor(kN);
    return r;
  };
  {  // A TOPK tensor with count 0: a few bytes that validate as 2^24 zeros.
    v1::RegisterRequest r = base();
    r.mutable_initial_weights()->set_codec(v1::CODEC_TOPK);
    r.mutable_initial_weights()->set_num_elements(kN);
    r.mutable_initial_weights()->set_payload(std::string(4, '\0'));
    tiny.push_back(r);
  }
  {  // The other compact codecs, same idea.
    for (v1::Codec codec : {v1::CODEC_RANDOMK, v1::CODEC_ONEBIT,
                            v1::CODEC_QUANTIZE, v1::CODEC_FP16}) {
      v1::RegisterRequest r = base();
      r.mutable_initial_weights()->set_codec(codec);
      r.mutable_initial_weights()->set_num_elements(kN);
      tiny.push_back(r);
    }
  }
  {  // Dense, but not the declared size.
    v1::RegisterRequest r = base();
    *r.mutable_initial_weights() = Fp32Tensor(std::vector<float>(8, 1.0f));
    tiny.push_back(r);
    r.mutable_initial_weights()->set_num_elements(kN);  // claims, not carries
    tiny.push_back(r);
  }
  {  // No initial weights at all.
    tiny.push_back(base());
  }
  const uint64_t checksum = s.StateChecksum();
  const long rss_before = RssKb();
  ASSERT_GT(rss_before, 0);
  for (const v1::RegisterRequest& r : tiny) {
    ASSERT_LT(r.ByteSizeLong(), 100u) << "the test's requests must be tiny";
  }
  for (const v1::RegisterRequest& r : tiny) {
    auto resp = s.Register(r);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument)
        << r.initial_weights().ShortDebugString().substr(0, 80) << ": "
        << resp.status();
    EXPECT_TRUE(Has(resp.status(), "initial_weights")) << resp.status();
  }
  const long grown_kb = RssKb() - rss_before;
  std::printf("Hole 1: %zu refused Registers at 2^24 elements grew RSS by %ld kB\n",
              tiny.size(), grown_kb);
  EXPECT_LT(grown_kb, 10 * 1024);
  // Nothing was installed: the shard is as it was, and a real model still
  // registers.
  EXPECT_FALSE(s.registered());
  EXPECT_EQ(s.StateChecksum(), checksum);
  auto ok = s.Register(RegisterRequestFor(0, 1, InitialWeights(kSmallElements)));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->initialized_model());
}

TEST(ShardHoles, Hole1InitialWeightsMessageNamesTheExpectedCodecAndSize) {
  auto shard = MakeShard(ExactSgdConfig(1));
  ASSERT_NE(shard, nullptr);
  v1::RegisterRequest r = RegisterRequestFor(0, 1, InitialWeights(kSmallElements));
  r.mutable_initial_weights()->set_codec(v1::CODEC_TOPK);
  auto topk = shard->Register(r);
  EXPECT_EQ(topk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(topk.status(), "initial_weights.codec")) << topk.status();
  EXPECT_TRUE(Has(topk.status(), "fp32")) << topk.status();
  r = RegisterRequestFor(0, 1, InitialWeights(kSmallElements - 1));
  auto short_fp32 = shard->Register(r);
  EXPECT_EQ(short_fp32.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(short_fp32.status(), "expected 1024 elements"))
      << short_fp32.status();
  EXPECT_FALSE(shard->registered());
}

TEST(ShardHoles, Hole1LayoutOverMaxModelElementsIsRefused) {
  ShardConfig c = ExactSgdConfig(1);
  c.max_model_elements = uint64_t{1} << 20;
  auto shard = MakeShard(c);
  ASSERT_NE(shard, nullptr);
  const long rss_before = RssKb();
  v1::RegisterRequest r;
  r.set_worker_id(0);
  r.set_num_workers(1);
  r.set_num_shards(1);
  *r.mutable_layout() = OneTensor((uint64_t{1} << 20) + 1);
  auto resp = shard->Register(r);
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kResourceExhausted)
      << resp.status();
  EXPECT_TRUE(Has(resp.status(), "1048576")) << resp.status();
  EXPECT_TRUE(Has(resp.status(), "max_model_elements")) << resp.status();
  EXPECT_LT(RssKb() - rss_before, 10 * 1024);
  EXPECT_FALSE(shard->registered());
  // Exactly the cap is accepted (the layout check; the weights carry it).
  *r.mutable_layout() = OneTensor(uint64_t{1} << 20);
  *r.mutable_initial_weights() =
      Fp32Tensor(std::vector<float>(uint64_t{1} << 20, 0.5f));
  EXPECT_TRUE(shard->Register(r).ok());
  // A cap beyond the layout's own limit is a configuration error.
  c.max_model_elements = kMaxModelElements + 1;
  EXPECT_EQ(Shard::Create(c, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Hole 2: resume_step was unbounded (2^63 skipped 2^63 rounds; 2^64-1 wrapped
// the step to 0). It is now below kMaxResumeStep, and a shard that has
// completed a round in this incarnation accepts at most step + 1.

TEST(ShardHoles, Hole2HugeResumeStepIsRefusedAndChangesNothing) {
  auto shard = MakeShard(ExactSgdConfig(2));
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  // Unregistered and catching up: even the first Register is refused.
  for (uint64_t resume : {uint64_t{1} << 63, ~uint64_t{0}, kMaxResumeStep}) {
    v1::RegisterRequest r = RegisterRequestFor(0, 2, InitialWeights(kSmallElements));
    r.set_resume_step(resume);
    auto resp = s.Register(r);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument)
        << resume << ": " << resp.status();
    EXPECT_TRUE(Has(resp.status(), "resume_step is " + std::to_string(resume)))
        << resp.status();
    EXPECT_FALSE(s.registered());
  }
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, InitialWeights(kSmallElements))).ok());
  }
  RunRounds(s, 2, 0, 3);
  // A push queued for step 3 must survive the refused Registers.
  ASSERT_TRUE(s.Push(PushRequestFor(0, 3, Fp32Tensor(Gradient(kSmallElements, 0, 3)))).ok());
  const v1::GetStatusResponse before = s.Status();
  const uint64_t hashes = s.status_hashes();
  for (uint64_t resume : {uint64_t{1} << 63, ~uint64_t{0}, kMaxResumeStep,
                          kMaxResumeStep + 1}) {
    v1::RegisterRequest r = RegisterRequestFor(1, 2, InitialWeights(kSmallElements));
    r.set_resume_step(resume);
    auto resp = s.Register(r);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << resume;
    EXPECT_TRUE(Has(resp.status(), "resume_step")) << resp.status();
  }
  const v1::GetStatusResponse after = s.Status();
  EXPECT_EQ(after.current_step(), 3u);
  EXPECT_EQ(after.state_checksum(), before.state_checksum());
  EXPECT_EQ(after.pushes_pending(), 1u);
  // Nothing changed the big arrays: Status() did not need to hash them again.
  EXPECT_EQ(s.status_hashes(), hashes);
  // The round goes on; pulls of the next step are not refused.
  ASSERT_TRUE(s.Push(PushRequestFor(1, 3, Fp32Tensor(Gradient(kSmallElements, 1, 3)))).ok());
  EXPECT_TRUE(s.PullBlocking(PullRequestFor(0, 4, -1, 0, true), absl::Seconds(30)).ok());
}

TEST(ShardHoles, Hole2ResumeStepAheadOfTheNextStepNeedsACatchingUpShard) {
  auto shard = MakeShard(ExactSgdConfig(2));
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, InitialWeights(kSmallElements))).ok());
  }
  RunRounds(s, 2, 0, 2);  // a round completed here: this shard lost nothing
  const uint64_t checksum = s.StateChecksum();
  v1::RegisterRequest r = RegisterRequestFor(0, 2, InitialWeights(kSmallElements));
  r.set_resume_step(4);
  auto ahead = s.Register(r);
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(ahead.status(), "resume_step is 4")) << ahead.status();
  EXPECT_TRUE(Has(ahead.status(), "expected at most 3")) << ahead.status();
  EXPECT_EQ(s.StateChecksum(), checksum);
  // step + 1 is what a push that reached only some shards leaves behind.
  r.set_resume_step(3);
  auto next = s.Register(r);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->current_step(), 3u);
  r.set_resume_step(2);  // at or behind the shard: nothing to skip
  EXPECT_TRUE(s.Register(r).ok());
  EXPECT_EQ(s.Status().current_step(), 3u);
}

TEST(ShardHoles, Hole2CatchingUpShardFastForwardsWithoutWrapping) {
  auto shard = MakeShard(ExactSgdConfig(1));
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  // A fresh incarnation (say it lost its checkpoints) may be far behind.
  const uint64_t resume = kMaxResumeStep - 1;
  v1::RegisterRequest r = RegisterRequestFor(0, 1, InitialWeights(kSmallElements));
  r.set_resume_step(resume);
  auto resp = s.Register(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->current_step(), resume);
  // One round later the step is resume + 1, not 0.
  ASSERT_TRUE(s.Push(PushRequestFor(0, resume, Fp32Tensor(Gradient(kSmallElements, 0, 0)))).ok());
  EXPECT_EQ(s.Status().current_step(), resume + 1);
  auto pulled = s.PullBlocking(PullRequestFor(0, resume + 1, -1, 0, true),
                               absl::Seconds(30));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->step(), resume + 1);
}

// ---------------------------------------------------------------------------
// Hole 4: a push that was validated but failed to decode was logged and
// still counted as a contributor. A queued push now carries a
// ValidatedTensor, so summing cannot fail: every contributor is a push that
// was summed, and the mean divides by exactly that count.

TEST(ShardHoles, Hole4ContributorsAreExactlyThePushesSummed) {
  ThreadPool pool(1);
  for (uint64_t n : {uint64_t{5}, uint64_t{1} << 17}) {
    constexpr uint32_t kWorkers = 6;
    Round round(kWorkers, &pool);
    round.Resize(n);
    // Workers 1 and 4 are not waited for (dropped) and never push.
    auto waits = [](uint32_t w) { return w != 1 && w != 4; };
    std::vector<v1::EncodedTensor> tensors;
    std::vector<float> sum(n, 0.0f);
    for (uint32_t w : {5u, 3u, 0u, 2u}) {  // arrival order
      std::vector<float> g(n, static_cast<float>(w + 1));
      v1::EncodedTensor t = Fp32Tensor(g);
      auto valid = ValidateTensor(t, n);
      ASSERT_TRUE(valid.ok());
      round.Queue(w, Round::Push::CopyOf(*valid));
      for (uint64_t i = 0; i < n; ++i) sum[i] += g[i];
    }
    uint32_t summed = 0;
    while (auto batch = round.BeginSum(waits)) {
      round.sum()->Add(*batch);
      round.EndSum(*batch);
      summed += 1;
    }
    ASSERT_TRUE(round.all_in());
    EXPECT_EQ(summed, 4u);
    EXPECT_EQ(round.contributors(), summed);
    EXPECT_EQ(round.received(), 4u);
    // (1 + 3 + 4 + 6) / 4 = 3.5, not / 6.
    round.WithMean([&](absl::Span<float> mean) {
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(mean[i], 3.5f) << i;
    });
  }
}

TEST(ShardHoles, Hole4InvalidPushIsNeverQueuedSoNeverCounted) {
  auto shard = MakeShard(ExactSgdConfig(2));
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  std::vector<float> x0(kSmallElements, 10.0f);
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, x0)).ok());
  }
  // A payload that cannot decode is refused before the round sees it.
  v1::EncodedTensor bad = Fp32Tensor(std::vector<float>(kSmallElements, 1.0f));
  bad.mutable_payload()->resize(bad.payload().size() - 1);
  EXPECT_EQ(s.Push(PushRequestFor(0, 0, bad)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Status().pushes_pending(), 0u);
  ASSERT_TRUE(s.Push(PushRequestFor(0, 0, Fp32Tensor(std::vector<float>(kSmallElements, 2.0f)))).ok());
  ASSERT_TRUE(s.Push(PushRequestFor(1, 0, Fp32Tensor(std::vector<float>(kSmallElements, 4.0f)))).ok());
  auto r = s.PullBlocking(PullRequestFor(0, 1, -1, 0, true), absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(DecodeAll(r->weights())[0], 7.0f);  // 10 - (2 + 4) / 2
}

// ---------------------------------------------------------------------------
// Hole 5: GetStatus hashed x, x_hat, m and v under the shard lock on every
// call, so a client polling it stalled the rounds. The hash is now computed
// at most once per change of the arrays.

TEST(ShardHoles, Hole5GetStatusFloodDoesNotStallTheRounds) {
  constexpr uint64_t kN = uint64_t{1} << 20;  // 4 MiB per array
  constexpr uint64_t kRounds = 40;
  ShardConfig c = testing_util::OneBitAdamConfig(2, 1000);
  auto shard = MakeShard(c);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  v1::ModelLayout layout = OneTensor(kN);
  for (uint32_t w = 0; w < 2; ++w) {
    v1::RegisterRequest r;
    r.set_worker_id(w);
    r.set_num_workers(2);
    r.set_num_shards(1);
    *r.mutable_layout() = layout;
    *r.mutable_initial_weights() = Fp32Tensor(InitialWeights(kN));
    ASSERT_TRUE(s.Register(r).ok());
  }
  const v1::EncodedTensor g0 = Fp32Tensor(Gradient(kN, 0, 0, 0.01f));
  const v1::EncodedTensor g1 = Fp32Tensor(Gradient(kN, 1, 0, 0.01f));
  std::atomic<uint64_t> next_step{0};
  // Runs `rounds` rounds from the current step; returns rounds per second.
  auto drive = [&](uint64_t rounds) {
    const absl::Time start = absl::Now();
    for (uint64_t i = 0; i < rounds; ++i) {
      const uint64_t step = next_step.load();
      if (!s.Push(PushRequestFor(0, step, g0)).ok()) return -1.0;
      if (!s.Push(PushRequestFor(1, step, g1)).ok()) return -1.0;
      if (!s.PullBlocking(PullRequestFor(0, step + 1, -1, 0, true),
                          absl::Seconds(30)).ok()) {
        return -1.0;
      }
      next_step.store(step + 1);
    }
    return rounds / absl::ToDoubleSeconds(absl::Now() - start);
  };
  const double quiet = drive(kRounds / 2);
  ASSERT_GT(quiet, 0);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 3; ++t) {
    flood.emplace_back([&] {
      while (!stop.load()) {
        (void)s.Status();
        calls.fetch_add(1);
      }
    });
  }
  // Let the flood get going before the rounds start.
  while (calls.load() < 100) std::this_thread::yield();
  const uint64_t hashes_before = s.status_hashes();
  double flooded = -1;
  absl::Notification done;
  std::thread driver([&] {
    flooded = drive(kRounds);
    done.Notify();
  });
  const bool finished = done.WaitForNotificationWithTimeout(absl::Seconds(60));
  stop.store(true);
  for (std::thread& t : flood) t.join();
  driver.join();
  ASSERT_TRUE(finished) << "rounds did not complete within 60 s under the flood";
  ASSERT_GT(flooded, 0) << "a round failed under the flood";
  EXPECT_EQ(s.Status().current_step(), kRounds / 2 + kRounds);
  EXPECT_GT(calls.load(), kRounds);
  // The flood cost at most one hash of the arrays per round.
  EXPECT_LE(s.status_hashes() - hashes_before, kRounds + 1);
  std::printf(
      "Hole 5: %lu-element shard, %.1f rounds/s quiet, %.1f rounds/s under a "
      "3-thread GetStatus flood (%lu calls, %lu array hashes)\n",
      static_cast<unsigned long>(kN), quiet, flooded,
      static_cast<unsigned long>(calls.load()),
      static_cast<unsigned long>(s.status_hashes() - hashes_before));
}

// ---------------------------------------------------------------------------
// Hole 8: the model cap (2^29 elements) made a one-shard fp32 snapshot 2 GiB,
// above the 2047 MiB message cap. A model whose slice's snapshot would not
// fit in max_response_bytes is refused at Register, so no pull can exceed it.

TEST(ShardHoles, Hole8SnapshotAboveTheResponseLimitIsRefused) {
  constexpr uint64_t kLimit = 64 * 1024;
  ShardConfig c = ExactSgdConfig(1);
  c.max_response_bytes = kLimit;
  auto shard = MakeShard(c);
  ASSERT_NE(shard, nullptr);
  // (limit - overhead) / 4 elements fit exactly; one shard-aligned step
  // more does not.
  const uint64_t fits = (kLimit - kPullResponseOverheadBytes) / 4;
  v1::RegisterRequest r;
  r.set_worker_id(0);
  r.set_num_workers(1);
  r.set_num_shards(1);
  *r.mutable_layout() = OneTensor(fits + 256);
  *r.mutable_initial_weights() = Fp32Tensor(InitialWeights(fits + 256));
  auto big = shard->Register(r);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted)
      << big.status();
  EXPECT_TRUE(Has(big.status(), std::to_string(kLimit))) << big.status();
  EXPECT_TRUE(Has(big.status(), "message limit")) << big.status();
  EXPECT_FALSE(shard->registered());

  *r.mutable_layout() = OneTensor(fits);
  *r.mutable_initial_weights() = Fp32Tensor(InitialWeights(fits));
  ASSERT_TRUE(shard->Register(r).ok());
  // The largest answer the shard gives, a snapshot, is within the limit.
  auto pulled = shard->PullBlocking(PullRequestFor(0, 0, -1, 0, true),
                                    absl::Seconds(30));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->kind(), v1::PULL_KIND_SNAPSHOT);
  EXPECT_LE(pulled->ByteSizeLong(), kLimit);
}

TEST(ShardHoles, Hole8LargestModelAgreesWithTheMessageCap) {
  // The daemon's message cap: 2047 MiB. Pulls are answered in chunks, so a
  // 2^29-element model (a 2 GiB snapshot) fits on one shard: only the
  // (absent) weights are refused. A chunk that would not fit the cap is
  // refused before anything is allocated, naming the cap.
  constexpr uint64_t kCap = uint64_t{2047} << 20;
  for (uint64_t cap : {kCap, uint64_t{128} << 20}) {
    ShardConfig c = ExactSgdConfig(1);
    c.max_response_bytes = cap;
    c.chunk_elements = kMaxChunkElements;  // 256 MiB of fp32 per chunk
    auto shard = MakeShard(c);
    ASSERT_NE(shard, nullptr);
    const long rss_before = RssKb();
    v1::RegisterRequest r;
    r.set_worker_id(0);
    r.set_num_workers(1);
    r.set_num_shards(1);
    *r.mutable_layout() = OneTensor(kMaxModelElements);
    auto resp = shard->Register(r);
    if (cap == kCap) {
      EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument)
          << resp.status();
      EXPECT_TRUE(Has(resp.status(), "initial_weights")) << resp.status();
    } else {
      EXPECT_EQ(resp.status().code(), absl::StatusCode::kResourceExhausted)
          << resp.status();
      EXPECT_TRUE(Has(resp.status(), std::to_string(cap))) << resp.status();
      EXPECT_TRUE(Has(resp.status(), "--chunk_elements")) << resp.status();
    }
    EXPECT_LT(RssKb() - rss_before, 10 * 1024);
  }
}

// ---------------------------------------------------------------------------
// Hole 11 (space enum): an unknown PushRequest.space was reported as
// FAILED_PRECONDITION "space is RAW; expected RAW". It is INVALID_ARGUMENT
// naming the number, before any state is read or changed.

TEST(ShardHoles, Hole11UnknownGradientSpaceIsInvalidArgumentNamingTheNumber) {
  auto shard = MakeShard(ExactSgdConfig(2));
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  const std::vector<float> g(kSmallElements, 1.0f);
  // Refused even before registration: the value is malformed whatever the
  // shard's state.
  for (int space : {3, 99, -1}) {
    v1::PushRequest p = PushRequestFor(0, 0, Fp32Tensor(g));
    p.set_space(static_cast<v1::GradientSpace>(space));
    auto resp = s.Push(p);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << space;
    EXPECT_TRUE(Has(resp.status(), "space is " + std::to_string(space)))
        << resp.status();
  }
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, InitialWeights(kSmallElements))).ok());
  }
  const uint64_t checksum = s.StateChecksum();
  for (int space : {3, 99, -1}) {
    v1::PushRequest p = PushRequestFor(0, 0, Fp32Tensor(g));
    p.set_space(static_cast<v1::GradientSpace>(space));
    auto resp = s.Push(p);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << space;
    EXPECT_TRUE(Has(resp.status(), "space is " + std::to_string(space)))
        << resp.status();
    EXPECT_FALSE(Has(resp.status(), "RAW;")) << resp.status();
  }
  EXPECT_EQ(s.StateChecksum(), checksum);
  EXPECT_EQ(s.Status().pushes_pending(), 0u);
  // The worker's well-formed push afterwards is accepted.
  EXPECT_TRUE(s.Push(PushRequestFor(0, 0, Fp32Tensor(g))).ok());
  // A known but wrong space stays FAILED_PRECONDITION.
  v1::PushRequest wrong = PushRequestFor(1, 0, Fp32Tensor(g),
                                         v1::GRADIENT_SPACE_PRECONDITIONED);
  EXPECT_EQ(s.Push(wrong).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pserver
