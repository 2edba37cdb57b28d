// CheckpointWriter (server/checkpoint_writer.h): WriteNow writes a loadable
// checkpoint or reports the failure (named path, counted once, the previous
// checkpoint kept); the background thread writes what is submitted, a newer
// state replaces one not yet written, Stop() writes what is still queued,
// and writes never overlap. Faults come from tests/common/fault_file_system.h.
#include "server/checkpoint_writer.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/metrics.h"
#include "tests/common/fault_file_system.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using testing_util::FaultFileSystem;
using testing_util::MakeTempDir;

// A consistent one-shard state of `step` rounds (256 elements).
ShardState State(uint64_t step) {
  ShardState s;
  s.num_workers = 2;
  s.step = step;
  s.freeze_step = 100;
  *s.layout.add_tensors() = testing_util::SmallLayout().tensors(1);
  const uint64_t n = 256;
  for (uint64_t i = 0; i < n; ++i) {
    s.x.push_back(0.001f * i + step);
    s.m.push_back(-0.5f * i);
    s.v.push_back(1.0f + i);
    s.x_hat.push_back(0.001f * i + step);
  }
  s.replica_checksum = ChecksumOf(s.x_hat);
  s.prev_replica_checksum = s.replica_checksum;
  s.last_pushed = {static_cast<int64_t>(step) - 1, static_cast<int64_t>(step) - 1};
  return s;
}

CheckpointExpectation Expect() {
  CheckpointExpectation e;
  e.num_workers = 2;
  return e;
}

// The step of the newest loadable checkpoint in dir, or -1.
int64_t NewestStep(const std::string& dir) {
  std::vector<std::string> refused;
  absl::StatusOr<ShardState> s = LoadNewestCheckpoint(dir, Expect(), &refused);
  return s.ok() ? static_cast<int64_t>(s->step) : -1;
}

// The checkpoint files in dir, sorted (names hold the zero-padded step).
std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string FileName(uint64_t step) {
  std::string digits = std::to_string(step);
  return "ckpt-" + std::string(20 - digits.size(), '0') + digits + ".pserver";
}

// Sum of a metric family's values (counter, or histogram sample count).
double MetricValue(prometheus::Registry& registry, const std::string& name) {
  double total = 0;
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      total += m.counter.value + static_cast<double>(m.histogram.sample_count);
    }
  }
  return total;
}
constexpr char kFailures[] = "pserver_server_checkpoint_failures_total";
constexpr char kWrites[] = "pserver_server_checkpoint_duration_seconds";

class CheckpointWriterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir("ckpt_writer"); }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string dir_;
  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_, 0};
};

TEST_F(CheckpointWriterTest, WriteNowWritesALoadableCheckpoint) {
  CheckpointWriter writer(dir_, 0, /*background=*/false, &metrics_);
  EXPECT_EQ(writer.dir(), dir_);
  ASSERT_TRUE(writer.WriteNow(State(5)).ok());
  std::vector<std::string> refused;
  absl::StatusOr<ShardState> back = LoadNewestCheckpoint(dir_, Expect(), &refused);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SerializeShardState(*back), SerializeShardState(State(5)));
  EXPECT_EQ(MetricValue(registry_, kWrites), 1.0);
  EXPECT_EQ(MetricValue(registry_, kFailures), 0.0);
  // Only the newest two are kept.
  ASSERT_TRUE(writer.WriteNow(State(6)).ok());
  ASSERT_TRUE(writer.WriteNow(State(7)).ok());
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{FileName(6), FileName(7)}));
}

TEST_F(CheckpointWriterTest, FailedWriteKeepsThePreviousCheckpointAndIsCounted) {
  FaultFileSystem fs(PosixFileSystem());
  CheckpointWriter writer(dir_, 0, /*background=*/false, &metrics_, &fs);
  ASSERT_TRUE(writer.WriteNow(State(1)).ok());
  const std::vector<std::string> before = Files(dir_);

  fs.FailWriteShort(1);  // the disk fills up half-way
  absl::Status s = writer.WriteNow(State(2));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir_), std::string::npos) << s;
  EXPECT_EQ(fs.faults(), 1);
  EXPECT_EQ(Files(dir_), before);
  EXPECT_EQ(NewestStep(dir_), 1);

  fs.FailRename(true);
  s = writer.WriteNow(State(3));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rename"), std::string::npos) << s;
  fs.FailRename(false);
  EXPECT_EQ(Files(dir_), before);

  fs.FailSync(true);
  s = writer.WriteNow(State(4));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fsync"), std::string::npos) << s;
  fs.FailSync(false);
  EXPECT_EQ(Files(dir_), before);
  EXPECT_EQ(NewestStep(dir_), 1);
  EXPECT_EQ(fs.faults(), 3);
  EXPECT_EQ(MetricValue(registry_, kFailures), 3.0);
  EXPECT_EQ(MetricValue(registry_, kWrites), 1.0);

  // The faults gone, the same writer writes again.
  ASSERT_TRUE(writer.WriteNow(State(5)).ok());
  EXPECT_EQ(NewestStep(dir_), 5);
}

TEST_F(CheckpointWriterTest, BackgroundWriterWritesWhatIsSubmittedAndStopFlushes) {
  CheckpointWriter writer(dir_, 0, /*background=*/true, &metrics_);
  writer.Submit(State(4));
  writer.Stop();  // writes the state if the thread had not yet
  EXPECT_EQ(NewestStep(dir_), 4);
  writer.Stop();  // idempotent
  EXPECT_EQ(MetricValue(registry_, kWrites), 1.0);
}

TEST_F(CheckpointWriterTest, BackgroundFailureIsCountedAndTheThreadGoesOn) {
  FaultFileSystem fs(PosixFileSystem());
  CheckpointWriter writer(dir_, 0, /*background=*/true, &metrics_, &fs);
  fs.FailRename(true);
  writer.Submit(State(1));
  // Wait (bounded) for the background attempt, without sleeping blindly.
  for (int i = 0; i < 2000 && fs.faults() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(fs.faults(), 1);
  fs.FailRename(false);
  writer.Submit(State(2));
  writer.Stop();
  EXPECT_EQ(NewestStep(dir_), 2);
  EXPECT_EQ(Files(dir_), std::vector<std::string>{FileName(2)});
  EXPECT_EQ(MetricValue(registry_, kFailures), 1.0);
}

// Holds the first file the writer opens until released, so a test can
// submit while a write is in progress; counts writes in flight.
class GateFileSystem : public FileSystemWrapper {
 public:
  explicit GateFileSystem(FileSystem* target) : FileSystemWrapper(target) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    bool first;
    {
      absl::MutexLock l(&mu_);
      first = opened_++ == 0;
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
    }
    if (first) {
      entered_.Notify();
      release_.WaitForNotification();
    }
    auto f = target()->NewWritableFile(path);
    if (!f.ok()) {
      Done();
      return f;
    }
    return std::unique_ptr<WritableFile>(new File(this, std::move(f).value()));
  }

  absl::Notification entered_, release_;
  int opened() const {
    absl::MutexLock l(&mu_);
    return opened_;
  }
  int max_in_flight() const {
    absl::MutexLock l(&mu_);
    return max_in_flight_;
  }

 private:
  class File : public WritableFile {
   public:
    File(GateFileSystem* fs, std::unique_ptr<WritableFile> f)
        : fs_(fs), f_(std::move(f)) {}
    ~File() override { fs_->Done(); }
    absl::Status Append(absl::string_view d) override { return f_->Append(d); }
    absl::Status Sync() override { return f_->Sync(); }
    absl::Status Close() override { return f_->Close(); }

   private:
    GateFileSystem* const fs_;
    std::unique_ptr<WritableFile> f_;
  };
  void Done() {
    absl::MutexLock l(&mu_);
    --in_flight_;
  }

  mutable absl::Mutex mu_;
  int opened_ ABSL_GUARDED_BY(mu_) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(CheckpointWriterTest, NewerStateReplacesOneNotYetWritten) {
  GateFileSystem fs(PosixFileSystem());
  CheckpointWriter writer(dir_, 0, /*background=*/true, &metrics_, &fs);
  writer.Submit(State(1));
  fs.entered_.WaitForNotification();  // step 1 is being written
  writer.Submit(State(2));
  writer.Submit(State(3));  // replaces 2, which is never written
  fs.release_.Notify();
  writer.Stop();
  EXPECT_EQ(fs.opened(), 2);
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{FileName(1), FileName(3)}));
  EXPECT_EQ(MetricValue(registry_, kWrites), 2.0);
}

TEST_F(CheckpointWriterTest, BackgroundAndWriteNowNeverOverlap) {
  GateFileSystem fs(PosixFileSystem());
  fs.release_.Notify();  // no gate: just count writes in flight
  CheckpointWriter writer(dir_, 0, /*background=*/true, &metrics_, &fs);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&writer, t] {
      for (uint64_t i = 0; i < 15; ++i) {
        EXPECT_TRUE(writer.WriteNow(State(100 * (t + 1) + i)).ok());
      }
    });
  }
  for (uint64_t i = 0; i < 30; ++i) writer.Submit(State(1000 + i));
  for (std::thread& t : threads) t.join();
  writer.Stop();
  EXPECT_EQ(fs.max_in_flight(), 1);
  EXPECT_GE(fs.opened(), 31);  // 30 WriteNow calls and at least one Submit
  EXPECT_EQ(MetricValue(registry_, kFailures), 0.0);
  // The last submitted state was written (Stop flushes it).
  EXPECT_EQ(NewestStep(dir_), 1029);
}

}  // namespace
}  // namespace pserver
