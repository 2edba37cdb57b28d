// Writes a shard's checkpoints off the round's path: the shard hands over a
// captured state and goes on; a background thread writes it (atomically,
// server/checkpoint.h). A newer state replaces one not yet written.
#ifndef PSERVER_SERVER_CHECKPOINT_WRITER_H_
#define PSERVER_SERVER_CHECKPOINT_WRITER_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"
#include "server/checkpoint.h"
#include "server/metrics.h"

namespace pserver {

// Thread-safe. Writes are serialised: the background thread's and
// WriteNow()'s never overlap.
class CheckpointWriter {
 public:
  // Writes into `dir` through `fs` (null: PosixFileSystem(); tests inject
  // faults); `metrics` and `fs` must outlive the writer. With `background`
  // a thread takes Submit()ted states; without it Submit() is not allowed.
  CheckpointWriter(std::string dir, uint32_t shard_index, bool background,
                   ServerMetrics* metrics, FileSystem* fs = nullptr);
  // Stops the thread (see Stop()).
  ~CheckpointWriter();

  // Hands `state` to the background thread. REQUIRES: background.
  void Submit(ShardState state) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Writes `state` now on the calling thread.
  absl::Status WriteNow(const ShardState& state) ABSL_LOCKS_EXCLUDED(disk_mu_);
  // Writes a state still queued, then joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(queue_mu_);

  const std::string& dir() const { return dir_; }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(queue_mu_);

  const std::string dir_;
  const uint32_t shard_index_;
  ServerMetrics* const metrics_;
  FileSystem* const fs_;
  absl::Mutex disk_mu_;
  absl::Mutex queue_mu_;
  std::optional<ShardState> queued_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::unique_ptr<std::thread> thread_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_CHECKPOINT_WRITER_H_
