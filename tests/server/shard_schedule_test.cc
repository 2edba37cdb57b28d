// A shard with a compression schedule (common/schedule.h): who may
// register, the phase announced in every answer, the pull codec of each
// phase, and the schedule in checkpoints.
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/rejection.h"
#include "common/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using testing_util::ExactSgdConfig;
using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;
using testing_util::Replica;

constexpr uint64_t kN = kSmallElements;

// Rounds [0, 0.2) pull 8-bit quantized, [0.2, 0.6) pull bf16, then onebit;
// the pushes' codecs are the workers' business.
constexpr char kSchedule[] = R"({"phases": [
  {"name": "early", "pull": {"codec": "quantize", "params": {"bits": 8}}},
  {"name": "middle", "begin_fraction": 0.2, "pull": {"codec": "bf16"}},
  {"name": "late", "begin_fraction": 0.6}]})";

std::shared_ptr<const CompressionSchedule> Schedule(const char* text) {
  auto s = CompressionSchedule::Parse(text, "test");
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : nullptr;
}

ShardConfig ScheduledConfig(uint32_t workers) {
  ShardConfig c = ExactSgdConfig(workers, v1::CODEC_ONEBIT);
  c.optimizer.lr = 0.01f;
  c.schedule = Schedule(kSchedule);
  return c;
}

v1::RegisterRequest ScheduledRegister(uint32_t w, uint32_t workers,
                                      const std::vector<float>& x0,
                                      const CompressionSchedule* s,
                                      uint64_t total) {
  v1::RegisterRequest r = RegisterRequestFor(w, workers, x0);
  if (s != nullptr) r.set_schedule_fingerprint(s->fingerprint());
  r.set_total_steps(total);
  return r;
}

TEST(ShardSchedule, RegisterRefusesAnotherScheduleOrRunLength) {
  const std::vector<float> x0 = InitialWeights(kN);
  ShardConfig c = ScheduledConfig(2);
  auto shard = Shard::Create(c, nullptr);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const uint64_t state = (*shard)->StateChecksum();
  auto other = Schedule(R"({"phases": [{"push": {"codec": "bf16"}}]})");
  struct Case {
    const char* what;
    const CompressionSchedule* schedule;
    uint64_t total;
    const char* message;
  };
  for (const Case& k :
       {Case{"no schedule", nullptr, 100, "schedule_fingerprint is 0000"},
        Case{"another schedule", other.get(), 100, "schedule_fingerprint is"},
        Case{"no run length", c.schedule.get(), 0, "total_steps is 0"},
        Case{"too short a run", c.schedule.get(), 3,
             "expected every phase to have at least one round"}}) {
    SCOPED_TRACE(k.what);
    auto r = (*shard)->Register(ScheduledRegister(0, 2, x0, k.schedule,
                                                  k.total));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(ReasonOf(r.status()), v1::REJECT_REASON_CONFIG_MISMATCH);
    EXPECT_THAT(r.status().message(), HasSubstr(k.message));
    EXPECT_EQ((*shard)->StateChecksum(), state);
    EXPECT_FALSE((*shard)->registered());
  }
  auto first = (*shard)->Register(ScheduledRegister(0, 2, x0, c.schedule.get(),
                                                    100));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->schedule_phase(), 0u);
  // The job's run length is set: another worker must agree with it.
  auto longer = (*shard)->Register(
      ScheduledRegister(1, 2, x0, c.schedule.get(), 200));
  ASSERT_FALSE(longer.ok());
  EXPECT_EQ(ReasonOf(longer.status()), v1::REJECT_REASON_CONFIG_MISMATCH);
  EXPECT_THAT(longer.status().message(),
              HasSubstr("total_steps is 200; the job runs 100 rounds"));
  EXPECT_TRUE((*shard)->Register(
                  ScheduledRegister(1, 2, x0, c.schedule.get(), 100))
                  .ok());
}

TEST(ShardSchedule, AnnouncesPhasesAndPullsWithEachPhasesCodec) {
  const std::vector<float> x0 = InitialWeights(kN);
  ShardConfig c = ScheduledConfig(1);
  auto created = Shard::Create(c, nullptr);
  ASSERT_TRUE(created.ok()) << created.status();
  Shard& shard = **created;
  ASSERT_TRUE(
      shard.Register(ScheduledRegister(0, 1, x0, c.schedule.get(), 10)).ok());
  // 10 rounds: phase 0 is rounds 0-1, phase 1 rounds 2-5, phase 2 6-9.
  const std::vector<uint32_t> want_phase = {0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2};
  const std::vector<v1::Codec> want_codec = {
      v1::CODEC_QUANTIZE, v1::CODEC_QUANTIZE, v1::CODEC_BF16, v1::CODEC_BF16,
      v1::CODEC_BF16,     v1::CODEC_BF16,     v1::CODEC_ONEBIT,
      v1::CODEC_ONEBIT,   v1::CODEC_ONEBIT,   v1::CODEC_ONEBIT};
  Replica replica{x0, 0};
  for (uint64_t t = 0; t < 10; ++t) {
    SCOPED_TRACE(t);
    ASSERT_TRUE(
        shard.Push(PushRequestFor(0, t, Fp32Tensor(Gradient(kN, 0, t)))).ok());
    auto r = shard.PullBlocking(
        PullRequestFor(0, t + 1, replica.step, ChecksumOf(replica.x)),
        absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->kind(), v1::PULL_KIND_DELTA);
    // Round t's delta uses round t's pull codec; the answer announces the
    // phase of the next round (the worker's next push).
    EXPECT_EQ(r->weights().codec(), want_codec[t]);
    EXPECT_EQ(r->schedule_phase(), want_phase[t + 1]);
    ASSERT_TRUE(replica.Apply(*r));
    // The residual x - x_hat carries across codec changes: the replica
    // stays what the shard tracks.
    ASSERT_EQ(ChecksumOf(replica.x), r->replica_checksum());
  }
  // A worker registering now (a rejoin) is told the current phase.
  auto again =
      shard.Register(ScheduledRegister(0, 1, x0, c.schedule.get(), 10));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->current_step(), 10u);
  EXPECT_EQ(again->schedule_phase(), 2u);
}

TEST(ShardSchedule, ConfigRefusesMixingFp32AndCompressedPulls) {
  ShardConfig c = ScheduledConfig(1);
  c.pull_codec = v1::CODEC_FP32;
  absl::Status s = ValidateShardConfig(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("schedule phase 0 pulls with quantize "
                                     "but --pull_codec is fp32"));
  c.schedule = Schedule(R"({"phases": [{},
      {"begin_step": 5, "pull": {"codec": "fp32"}}]})");
  EXPECT_TRUE(ValidateShardConfig(c).ok());
  c.pull_codec = v1::CODEC_ONEBIT;
  EXPECT_THAT(ValidateShardConfig(c).message(),
              HasSubstr("schedule phase 1 pulls with fp32"));
}

TEST(ShardSchedule, CheckpointKeepsTheRunLengthAndRefusesAnotherSchedule) {
  const std::vector<float> x0 = InitialWeights(kN);
  const std::string dir = testing_util::MakeTempDir("shard_schedule");
  ShardConfig c = ScheduledConfig(1);
  c.checkpoint_dir = dir;
  {
    auto shard = Shard::Create(c, nullptr);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_TRUE(
        (*shard)->Register(ScheduledRegister(0, 1, x0, c.schedule.get(), 10))
            .ok());
    for (uint64_t t = 0; t < 3; ++t) {
      ASSERT_TRUE((*shard)
                      ->Push(PushRequestFor(0, t,
                                            Fp32Tensor(Gradient(kN, 0, t))))
                      .ok());
    }
    ASSERT_TRUE((*shard)->Close().ok());
  }
  {
    // Restored: the run length came back with the model, so the phase of
    // round 3 is known before any worker registers, and a worker with
    // another run length is refused.
    auto shard = Shard::Create(c, nullptr);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ((*shard)->Status().current_step(), 3u);
    auto pull = (*shard)->PullBlocking(PullRequestFor(0, 3, -1, 0),
                                       absl::Seconds(10));
    ASSERT_TRUE(pull.ok()) << pull.status();
    EXPECT_EQ(pull->schedule_phase(), 1u);
    auto longer = (*shard)->Register(
        ScheduledRegister(0, 1, x0, c.schedule.get(), 20));
    ASSERT_FALSE(longer.ok());
    EXPECT_THAT(longer.status().message(), HasSubstr("the job runs 10"));
    ASSERT_TRUE((*shard)->Close().ok());
  }
  {
    // Another schedule: the checkpoint is refused, the shard starts fresh.
    ShardConfig other = c;
    other.schedule = Schedule(R"({"phases": [{"pull": {"codec": "bf16"}}]})");
    auto shard = Shard::Create(other, nullptr);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_FALSE((*shard)->registered());
    bool refused = false;
    for (const std::string& line : (*shard)->startup_log()) {
      refused |= line.find("compression schedule") != std::string::npos;
    }
    EXPECT_TRUE(refused) << ::testing::PrintToString((*shard)->startup_log());
  }
}

}  // namespace
}  // namespace pserver
