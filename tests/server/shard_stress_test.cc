// Many workers pushing to one shard at once, for ThreadSanitizer
// (tests/sanitizers.sh) as much as for the result: 16 threads x 50 rounds
// with mixed codecs, waiting pulls, the lease reaper and the background
// checkpoint writer all running. The final state must equal a sequential
// run of the same pushes bit for bit.
#include <stdlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;
using testing_util::Replica;

constexpr uint32_t kWorkers = 16;
constexpr uint64_t kSteps = 50;

ShardConfig StressConfig(const std::string& checkpoint_dir) {
  ShardConfig c;
  c.num_workers = kWorkers;
  c.optimizer.kind = OptimizerKind::kOneBitAdam;
  c.optimizer.lr = 1e-2f;
  c.optimizer.freeze_step = 10;
  c.optimizer.preconditioned = false;  // raw gradients in both stages
  c.pull_codec = v1::CODEC_ONEBIT;
  c.checkpoint_dir = checkpoint_dir;
  c.checkpoint_every = checkpoint_dir.empty() ? 0 : 5;
  // Long enough never to expire here; the reaper thread still runs.
  c.lease_timeout = absl::Seconds(60);
  return c;
}

v1::EncodedTensor Encoded(uint32_t worker, uint64_t step) {
  static constexpr v1::Codec kCodecs[] = {
      v1::CODEC_FP32, v1::CODEC_ONEBIT, v1::CODEC_TOPK, v1::CODEC_QUANTIZE,
      v1::CODEC_RANDOMK, v1::CODEC_FP16};
  v1::CodecParams p;
  p.set_block_size(128);
  p.set_k(64);
  auto codec = MakeCodec(kCodecs[worker % 6], p);
  EXPECT_TRUE(codec.ok());
  v1::EncodedTensor t;
  EXPECT_TRUE((*codec)
                  ->Encode(Gradient(kSmallElements, worker, step),
                           worker * 1000 + step, &t)
                  .ok());
  return t;
}

std::string TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string t = std::string(base && *base ? base : "/tmp") +
                  "/shard-stress-XXXXXX";
  std::vector<char> buf(t.begin(), t.end());
  buf.push_back('\0');
  EXPECT_NE(mkdtemp(buf.data()), nullptr);
  return buf.data();
}

std::unique_ptr<Shard> Registered(const ShardConfig& c) {
  auto shard = Shard::Create(c, nullptr);
  EXPECT_TRUE(shard.ok()) << shard.status();
  const std::vector<float> x0 = InitialWeights(kSmallElements);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE((*shard)->Register(RegisterRequestFor(w, kWorkers, x0)).ok());
  }
  return *std::move(shard);
}

TEST(ShardStress, SixteenWorkersPushingConcurrentlyMatchASequentialRun) {
  // Reference: the same pushes from one thread.
  std::unique_ptr<Shard> reference = Registered(StressConfig(""));
  for (uint64_t step = 0; step < kSteps; ++step) {
    for (uint32_t w = kWorkers; w-- > 0;) {
      ASSERT_TRUE(
          reference->Push(PushRequestFor(w, step, Encoded(w, step))).ok());
    }
  }
  ASSERT_EQ(reference->Status().current_step(), kSteps);

  const std::string dir = TempDir();
  std::unique_ptr<Shard> shard = Registered(StressConfig(dir));
  std::vector<std::thread> threads;
  std::vector<int> failures(kWorkers, 0);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      Replica replica;
      for (uint64_t step = 0; step < kSteps; ++step) {
        // A duplicate now and then, as a retrying worker would send.
        int sends = (w + step) % 7 == 0 ? 2 : 1;
        for (int i = 0; i < sends; ++i) {
          auto r = shard->Push(PushRequestFor(w, step, Encoded(w, step)));
          if (!r.ok()) ++failures[w];
        }
        auto pull = shard->PullBlocking(
            PullRequestFor(w, step + 1, replica.step,
                           ChecksumOf(replica.x)),
            absl::Seconds(120));
        if (!pull.ok() || !replica.Apply(*pull) ||
            ChecksumOf(replica.x) != pull->replica_checksum()) {
          ++failures[w];
        }
      }
    });
  }
  // Readers racing the rounds.
  std::thread reader([&] {
    while (shard->Status().current_step() < kSteps) {
      (void)shard->StateChecksum();
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  for (std::thread& t : threads) t.join();
  reader.join();
  for (uint32_t w = 0; w < kWorkers; ++w) EXPECT_EQ(failures[w], 0) << w;
  EXPECT_EQ(shard->Status().current_step(), kSteps);
  EXPECT_EQ(shard->StateChecksum(), reference->StateChecksum());
  EXPECT_TRUE(shard->Close().ok());
  shard.reset();
  std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace pserver
