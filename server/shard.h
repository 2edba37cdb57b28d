// One shard of the parameter server: the model slice it owns, the optimizer,
// the pushes of the current round and the replica that workers hold. The
// gRPC service (server/service.h) is a thin layer over this class, so tests
// can drive it directly.
//
// A round (synchronous, BSP): pushes for step t are validated when they
// arrive, then decoded and summed in worker-id order, never arrival order, so
// a run is bit-reproducible. When all expected workers' pushes for t are in,
// the optimizer runs once on mean = sum * (1 / W); the pull delta
// d = encode(x - x_hat) is made with the pull codec and x_hat += decode(d);
// step t + 1 becomes pullable and waiting pulls are answered.
//
// Rejected requests never change state: every check runs before anything is
// written.
#ifndef PSERVER_SERVER_SHARD_H_
#define PSERVER_SERVER_SHARD_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/layout.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/checkpoint.h"
#include "server/optimizer.h"

namespace pserver {

class ServerMetrics;

struct ShardConfig {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t num_workers = 1;
  OptimizerConfig optimizer;
  // The codec of pull deltas. CODEC_FP32 means every pull is an exact fp32
  // snapshot of x (as many bytes as an fp32 delta, and no rounding).
  v1::Codec pull_codec = v1::CODEC_ONEBIT;
  v1::CodecParams pull_params;
  // Where checkpoints go (empty: none). The newest usable one is loaded at
  // start. One folder per shard.
  std::string checkpoint_dir;
  // Write a checkpoint every this many rounds (0: only on Close()).
  uint64_t checkpoint_every = 0;
  // A worker that makes no call for this long while the round waits for it
  // is dropped from the rounds, so the others go on (0: never). Waiting in
  // a Pull, or having pushed the current round, counts as alive.
  absl::Duration lease_timeout = absl::ZeroDuration();
};

absl::Status ValidateShardConfig(const ShardConfig& c);

// Thread-safe: every public method may be called concurrently.
class Shard {
 public:
  // `metrics` may be null; if not, it must outlive the shard.
  static absl::StatusOr<std::unique_ptr<Shard>> Create(
      const ShardConfig& config, ServerMetrics* metrics);

  // Joins a worker; the first call sets layout and initial weights.
  // INVALID_ARGUMENT for malformed fields, FAILED_PRECONDITION for a layout,
  // shard or worker count that disagrees with the shard's.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Applies one worker's push for the current step. Blocks while the push
  // is decoded and, for the round's last push, while the optimizer runs.
  // Returns duplicate=true for a (worker, step) already received.
  // FAILED_PRECONDITION before registration, for a step ahead of the shard or
  // a gradient space the stage does not expect; ABORTED for a stale step the
  // worker had not pushed; INVALID_ARGUMENT for a bad payload.
  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  using PullDone = std::function<void(absl::Status, v1::PullResponse)>;
  // Answers a pull through `done`, exactly once: at once when the step is
  // available, or when its round completes, or with an error. A waiting pull
  // is registered under the returned id; CancelPull(id) answers it with
  // `why` if it is still waiting. `done` runs without the shard's lock held.
  uint64_t Pull(const v1::PullRequest& req, PullDone done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CancelPull(uint64_t id, absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocking form for tests and tools: waits up to `timeout`.
  absl::StatusOr<v1::PullResponse> PullBlocking(const v1::PullRequest& req,
                                                absl::Duration timeout);

  absl::StatusOr<v1::GetFrozenVarianceResponse> GetFrozenVariance(
      const v1::GetFrozenVarianceRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  v1::GetStatusResponse Status() ABSL_LOCKS_EXCLUDED(mu_);

  bool registered() ABSL_LOCKS_EXCLUDED(mu_);
  // Checksum64 of step, weights, optimizer moments and replica.
  uint64_t StateChecksum() ABSL_LOCKS_EXCLUDED(mu_);

  // Answers every waiting pull with UNAVAILABLE and refuses new calls; for
  // graceful shutdown.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Writes a checkpoint of the current state now (blocking on the disk).
  // FAILED_PRECONDITION without a checkpoint_dir or before registration.
  absl::Status SaveCheckpoint() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the background checkpoint writer and, with a checkpoint_dir,
  // writes a final checkpoint. Call after in-flight calls have finished.
  absl::Status Close() ABSL_LOCKS_EXCLUDED(mu_);
  ~Shard();

  // Where the state came from at start: "fresh" or the checkpoint's path
  // and step, plus any checkpoints refused on the way.
  const std::vector<std::string>& startup_log() const { return startup_log_; }

  const ShardConfig& config() const { return config_; }

  // Times two pushes were decoded at once on two cores (large shards).
  uint64_t paired_sums() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return paired_sums_;
  }

 private:
  struct Waiter {
    uint64_t id;
    v1::PullRequest request;
    PullDone done;
  };
  using Ready = std::function<void()>;

  Shard(const ShardConfig& config, ServerMetrics* metrics,
        std::unique_ptr<Codec> pull_codec);

  // Installs a model (first registration or a checkpoint).
  void InstallModel(const v1::ModelLayout& layout,
                    const std::vector<TensorSlot>& slots, std::vector<float> x)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestoreFrom(ShardState state) ABSL_LOCKS_EXCLUDED(mu_);
  ShardState CaptureState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FastForward(uint64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(writer_mu_);
  // Drops live workers whose lease expired; returns what to run unlocked.
  std::vector<Ready> ReapLeases(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReaperLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Touch(uint32_t worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLiveness() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t StateChecksumLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status CheckWorker(uint32_t worker_id, absl::string_view field) const;
  // Builds the answer to a pull whose step is available.
  absl::StatusOr<v1::PullResponse> AnswerPull(const v1::PullRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decodes queued pushes in worker-id order while this thread owns acc_;
  // completes the round when the last is in. Returns the pulls to answer.
  std::vector<Ready> Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Ready> CompleteRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Ready> WakeWaiters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardConfig config_;
  ServerMetrics* const metrics_;
  const std::unique_ptr<Codec> pull_codec_;

  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  v1::ModelLayout layout_ ABSL_GUARDED_BY(mu_);
  ShardRange range_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> worker_registered_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::vector<float> x_ ABSL_GUARDED_BY(mu_);      // weights
  std::vector<float> x_hat_ ABSL_GUARDED_BY(mu_);  // replica workers hold
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;         // completed rounds
  // Last step each worker's push was received for (-1: none).
  std::vector<int64_t> last_pushed_ ABSL_GUARDED_BY(mu_);
  // Leases. live_[w]: the rounds wait for w. A worker that registers again
  // after being dropped is live from the next round (rejoin_[w]).
  std::vector<bool> live_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> rejoin_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  uint32_t contributors_ ABSL_GUARDED_BY(mu_) = 0;  // summed this round
  uint64_t paired_sums_ ABSL_GUARDED_BY(mu_) = 0;
  bool reaper_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<std::thread> reaper_;

  // The current round: validated pushes waiting to be summed, by worker id;
  // next_ is the first worker not yet summed. acc_ is written only by the
  // thread that set draining_, and may be written without mu_ while it is.
  std::vector<std::unique_ptr<v1::EncodedTensor>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Codec>> pending_codec_ ABSL_GUARDED_BY(mu_);
  uint32_t received_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<float> acc_;
  std::vector<float> scratch_;  // second decode of a pair; like acc_
  absl::Time round_start_ ABSL_GUARDED_BY(mu_);

  // The delta that takes x_hat(step_ - 1) to x_hat(step_), if there is one.
  std::optional<v1::EncodedTensor> delta_ ABSL_GUARDED_BY(mu_);
  uint64_t prev_replica_checksum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t replica_checksum_ ABSL_GUARDED_BY(mu_) = 0;

  uint64_t next_waiter_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);

  std::vector<std::string> startup_log_;

  // Background checkpoint writer: CompleteRound hands it a captured state;
  // it writes without holding mu_. disk_mu_ serialises all writers.
  absl::Mutex disk_mu_;
  absl::Mutex writer_mu_;
  std::optional<ShardState> to_write_ ABSL_GUARDED_BY(writer_mu_);
  bool writer_stop_ ABSL_GUARDED_BY(writer_mu_) = false;
  std::unique_ptr<std::thread> writer_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_SHARD_H_
