// Checkpoint files on their own: the format (round trip, byte identity with
// version 1, refusal of damaged or inconsistent files) and writes that fail
// half-way, injected through a FileSystem wrapper.
#include <algorithm>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/file_io.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "server/optimizer.h"
#include "tests/common/fault_file_system.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using testing_util::FaultFileSystem;
using testing_util::Fp32Tensor;

TEST(Checkpoint, SerializeParseRoundTrip) {
  ShardState s;
  s.shard_index = 1;
  s.num_shards = 3;
  s.num_workers = 2;
  s.step = 42;
  s.frozen = true;
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(0);
  uint64_t n = ShardRangeFor(768, 3, 1).size();
  s.x.assign(n, 1.5f);
  s.m.assign(n, -2.0f);
  s.v.assign(n, 3.0f);
  s.x_hat.assign(n, 4.0f);
  s.last_pushed = {41, 40};
  s.delta = {Fp32Tensor(std::vector<float>(n, 0.25f))};
  for (bool worker_momentum : {false, true}) {
    s.worker_momentum = worker_momentum;
    std::string bytes = SerializeShardState(s);
    auto back = ParseShardState(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->worker_momentum, worker_momentum);
    EXPECT_EQ(SerializeShardState(*back), bytes);
  }
}

// Version 4 is version 3 plus u64 schedule_fingerprint and u64
// schedule_total_steps after local_steps; version 3 is version 2 plus u32
// local_steps after replica_checksum. The bytes of this state without those
// fields must be the version 2 file the original writer produced (size and
// Checksum64 recorded then, unchanged since version 1 but for the version
// number), and version 2 and 3 files still load: as a job that pushed every
// step, without a schedule.
TEST(Checkpoint, OlderFormatVersionsAreTheNewestWithoutItsFields) {
  ShardState s;
  s.shard_index = 1;
  s.num_shards = 3;
  s.num_workers = 2;
  s.step = 42;
  s.freeze_step = 7;
  s.frozen = true;
  s.preconditioned = false;
  s.prev_replica_checksum = 0x1122334455667788ull;
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(0);
  uint64_t n = ShardRangeFor(768, 3, 1).size();
  for (uint64_t i = 0; i < n; ++i) {
    s.x.push_back(0.5f * i);
    s.m.push_back(-0.25f * i);
    s.v.push_back(1.0f + i);
    s.x_hat.push_back(0.5f * i + 1);
  }
  s.replica_checksum = ChecksumOf(s.x_hat);
  s.last_pushed = {41, -1};
  s.delta = {Fp32Tensor(std::vector<float>(n, 0.25f))};
  s.local_steps = 1;
  const std::string v6 = SerializeShardState(s);
  EXPECT_EQ(v6.size(), 5326u);
  // An older version: `drop` bytes cut at `at`, the version number set, the
  // trailing Checksum64 redone.
  auto older = [](const std::string& newer, size_t at, size_t drop,
                  uint32_t version) {
    std::string b =
        newer.substr(0, at) + newer.substr(at + drop, newer.size() - at - drop - 8);
    b.replace(8, 4, reinterpret_cast<const char*>(&version), 4);
    Checksum64 trailer;
    trailer.Update(b.data(), b.size());
    const uint64_t sum = trailer.Finish();
    b.append(reinterpret_cast<const char*>(&sum), 8);
    return b;
  };
  // Offsets: magic 8, five u32, four u8, four u64 = 64; local_steps 4;
  // the schedule's two u64 16; the Adam hyper-parameters 13; the idle
  // rounds (an empty list: its u64 count) last, before the 8-byte trailer.
  const std::string v5 = older(v6, v6.size() - 16, 8, 5);
  EXPECT_EQ(v5.size(), 5318u);
  const std::string v4 = older(v5, 84, 13, 4);
  const std::string v3 = older(v4, 68, 16, 3);
  const std::string v2 = older(v3, 64, 4, 2);
  Checksum64 h;
  h.Update(v2.data(), v2.size());
  EXPECT_EQ(v2.size(), 5285u);
  EXPECT_EQ(h.Finish(), 0xec80687abfd4e7f8ull);
  for (const std::string* file : {&v2, &v3, &v4, &v5}) {
    auto old = ParseShardState(*file);
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(old->local_steps, 1u);
    EXPECT_EQ(old->schedule_fingerprint, 0u);
    EXPECT_EQ(old->schedule_total_steps, 0u);
    EXPECT_FALSE(old->has_adam_hyper);
    EXPECT_EQ(old->x, s.x);
    EXPECT_EQ(old->step, 42u);
    EXPECT_TRUE(old->idle_rounds.empty());
    EXPECT_EQ(SerializeShardState(*old), v6);
  }
  // Versions 5 and 6 carry the values; local_steps 0 is refused, and so are
  // betas outside [0, 1).
  s.local_steps = 16;
  s.schedule_fingerprint = 0xfeedfacecafebeefull;
  s.schedule_total_steps = 9370;
  s.has_adam_hyper = true;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-6f;
  auto now = ParseShardState(SerializeShardState(s));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->local_steps, 16u);
  EXPECT_EQ(now->schedule_fingerprint, 0xfeedfacecafebeefull);
  EXPECT_EQ(now->schedule_total_steps, 9370u);
  EXPECT_TRUE(now->has_adam_hyper);
  EXPECT_EQ(now->beta2, 0.95f);
  EXPECT_EQ(now->eps, 1e-6f);
  s.beta2 = 1.0f;
  EXPECT_EQ(ParseShardState(SerializeShardState(s)).status().code(),
            absl::StatusCode::kInvalidArgument);
  s.beta2 = 0.95f;
  s.local_steps = 0;
  EXPECT_EQ(ParseShardState(SerializeShardState(s)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A version beyond the newest is refused naming the range.
  const std::string v7 = older(v6, 68, 0, 7);
  auto future = ParseShardState(v7);
  ASSERT_FALSE(future.ok());
  EXPECT_NE(future.status().message().find("expected 2..6"), std::string::npos)
      << future.status();
}

// Regression (issue 6, found by the checkpoint fuzzer): an Adam checkpoint
// with a valid checksum but no v was loaded and crashed the first round.
TEST(Checkpoint, Issue6AdamStateWithoutVarianceIsRefused) {
  ShardState s;
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(1);
  s.x.assign(256, 1.0f);
  s.m.assign(256, 0.0f);
  s.x_hat.assign(256, 1.0f);
  s.last_pushed = {0};
  for (OptimizerKind kind : {OptimizerKind::kOneBitAdam, OptimizerKind::kAdam}) {
    s.optimizer_kind = static_cast<uint32_t>(kind);
    s.v.clear();
    auto r = ParseShardState(SerializeShardState(s));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("checkpoint v"), std::string::npos);
  }
  s.optimizer_kind = static_cast<uint32_t>(OptimizerKind::kSgd);
  EXPECT_TRUE(ParseShardState(SerializeShardState(s)).ok());
  s.v.assign(256, 1.0f);
  EXPECT_FALSE(ParseShardState(SerializeShardState(s)).ok());
}

// Issue 47: a shard of a model with fewer blocks than shards holds no
// elements; its own Adam checkpoint (v empty, as every array) was refused
// as "v holds 0 elements; expected 0", so after a restart it came up empty
// and the resumed job waited for it until the lease ran out.
TEST(Checkpoint, Issue47AnEmptyShardsAdamCheckpointLoads) {
  ShardState s;
  s.shard_index = 1;
  s.num_shards = 2;
  s.optimizer_kind = static_cast<uint32_t>(OptimizerKind::kAdam);
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(1);
  ASSERT_EQ(ShardRangeFor(256, 2, 1).size(), 0u);
  s.last_pushed = {3};
  s.step = 4;
  auto r = ParseShardState(SerializeShardState(s));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 4u);
}

TEST(Checkpoint, EveryTruncationAndBitFlipIsRefusedWithoutCrashing) {
  ShardState s;
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(1);
  s.x.assign(256, 1.0f);
  s.m.assign(256, 0.0f);
  s.v.assign(256, 0.0f);
  s.x_hat.assign(256, 1.0f);
  s.last_pushed = {0};
  std::string bytes = SerializeShardState(s);
  for (size_t cut = 0; cut < bytes.size(); cut += 7) {
    EXPECT_FALSE(ParseShardState(bytes.substr(0, cut)).ok()) << cut;
  }
  for (size_t i = 0; i < bytes.size(); i += 13) {
    std::string b = bytes;
    b[i] ^= 0x10;
    EXPECT_FALSE(ParseShardState(b).ok()) << i;
  }
}

ShardState SmallState(uint64_t step) {
  ShardState s;
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(1);
  s.x.assign(256, static_cast<float>(step));
  s.m.assign(256, 0.0f);
  s.v.assign(256, 1.0f);
  s.x_hat.assign(256, 1.0f);
  s.replica_checksum = ChecksumOf(s.x_hat);
  s.last_pushed = {0};
  s.step = step;
  return s;
}

std::vector<std::string> Listing(const std::string& dir) {
  auto names = PosixFileSystem()->ListDir(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  std::sort(names->begin(), names->end());
  return *names;
}

// A write that fails at any step (a full disk, a failed fsync or rename)
// returns an error naming the file, leaves no temporary behind, and the
// previous checkpoint still loads.
TEST(CheckpointWrite, FailedWriteKeepsThePreviousCheckpoint) {
  struct Case {
    const char* name;
    void (*arm)(FaultFileSystem&);
  };
  const Case cases[] = {
      {"short write", [](FaultFileSystem& f) { f.FailWriteShort(1); }},
      {"failed fsync", [](FaultFileSystem& f) { f.FailSync(true); }},
      {"failed rename", [](FaultFileSystem& f) { f.FailRename(true); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = testing_util::MakeTempDir("ckpt_fault");
    FaultFileSystem fs(PosixFileSystem());
    ASSERT_TRUE(WriteCheckpoint(dir, SmallState(1), 2, &fs).ok());
    c.arm(fs);
    absl::Status st = WriteCheckpoint(dir, SmallState(2), 2, &fs);
    EXPECT_EQ(fs.faults(), 1);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find(dir + "/ckpt-00000000000000000002.pserver"),
              std::string::npos)
        << st;
    EXPECT_EQ(Listing(dir),
              std::vector<std::string>{"ckpt-00000000000000000001.pserver"});
    std::vector<std::string> refused;
    auto got = LoadNewestCheckpoint(dir, CheckpointExpectation(), &refused, &fs);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->step, 1u);
    EXPECT_TRUE(refused.empty());
  }
}

// What a crash leaves (a temporary file) is never loaded and is removed by
// the next successful write, which also keeps only the newest `keep` files.
TEST(CheckpointWrite, RetentionRemovesOldFilesAndStrayTemporaries) {
  const std::string dir = testing_util::MakeTempDir("ckpt_retention");
  ASSERT_TRUE(WriteCheckpoint(dir, SmallState(1)).ok());
  const std::string stray = dir + "/ckpt-00000000000000000009.pserver.tmp";
  ASSERT_TRUE(WriteFileAtomically(stray, SerializeShardState(SmallState(9))).ok());
  auto got = LoadNewestCheckpoint(dir, CheckpointExpectation(), nullptr);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->step, 1u);
  ASSERT_TRUE(WriteCheckpoint(dir, SmallState(2)).ok());
  ASSERT_TRUE(WriteCheckpoint(dir, SmallState(3)).ok());
  EXPECT_EQ(Listing(dir),
            (std::vector<std::string>{"ckpt-00000000000000000002.pserver",
                                      "ckpt-00000000000000000003.pserver"}));
}

TEST(CheckpointWrite, UncreatableFolderIsNamed) {
  const std::string dir = testing_util::MakeTempDir("ckpt_mkdir");
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  absl::Status st = WriteCheckpoint(dir + "/file/sub", SmallState(1));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir + "/file/sub"), std::string::npos) << st;
}

}  // namespace
}  // namespace pserver
