#include "server/checkpoint_writer.h"

#include <cstdio>
#include <utility>

#include "absl/time/clock.h"

namespace pserver {

CheckpointWriter::CheckpointWriter(std::string dir, uint32_t shard_index,
                                   bool background, ServerMetrics* metrics,
                                   FileSystem* fs)
    : dir_(std::move(dir)),
      shard_index_(shard_index),
      metrics_(metrics),
      fs_(fs != nullptr ? fs : PosixFileSystem()) {
  if (background) thread_ = std::make_unique<std::thread>([this] { Loop(); });
}

CheckpointWriter::~CheckpointWriter() { Stop(); }

void CheckpointWriter::Submit(ShardState state) {
  absl::MutexLock l(&queue_mu_);
  queued_ = std::move(state);  // a newer state replaces an unwritten one
}

absl::Status CheckpointWriter::WriteNow(const ShardState& state) {
  absl::MutexLock disk(&disk_mu_);
  const absl::Time start = absl::Now();
  absl::Status s = WriteCheckpoint(dir_, state, /*keep=*/2, fs_);
  metrics_->ObserveCheckpoint(s.ok(), absl::ToDoubleSeconds(absl::Now() - start));
  return s;
}

void CheckpointWriter::Stop() {
  {
    absl::MutexLock l(&queue_mu_);
    stop_ = true;
  }
  if (thread_) {
    thread_->join();
    thread_.reset();
  }
}

void CheckpointWriter::Loop() {
  while (true) {
    std::optional<ShardState> state;
    {
      absl::MutexLock l(&queue_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return queued_.has_value() || stop_;
      };
      queue_mu_.Await(absl::Condition(&ready));
      if (!queued_.has_value()) return;  // stopping, nothing left
      state = std::move(queued_);
      queued_.reset();
    }
    absl::Status s = WriteNow(*state);
    if (!s.ok()) {
      std::fprintf(stderr, "pserver: shard %u: checkpoint failed: %s\n",
                   shard_index_, std::string(s.message()).c_str());
    }
  }
}

}  // namespace pserver
