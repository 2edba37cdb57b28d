// One shard of the parameter server: a thin coordinator over the parts that
// each live in a file of their own:
//   server/round.h            the pushes of a round, summed in worker order
//   server/round_policy.h     what a round waits for (bsp, ssp, async)
//   server/optimizer.h        the optimizer (1-bit Adam, Adam, SGD)
//   server/replica_tracker.h  x_hat, pull deltas and snapshots, checksums
//   server/pull_waiters.h     pulls parked until their round completes
//   server/lease_table.h      which workers the rounds wait for (leases,
//                             joins and leaves; shard_leases.cc)
//   server/checkpoint_writer.h  checkpoints written off the round's path
// The gRPC service (server/service.h) is a thin layer over this class, so
// tests drive it directly.
//
// One round: pushes for step t are validated when they arrive (no lock),
// queued, and summed in worker-id order; the round's last push runs the
// optimizer once on mean = sum / contributors, advances the replica through
// the pull codec, and answers the pulls waiting for step t + 1.
//
// Rejected requests never change state: every check runs before anything is
// written, and each refusal carries a reason (common/rejection.h).
#ifndef PSERVER_SERVER_SHARD_H_
#define PSERVER_SERVER_SHARD_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
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
#include "common/chunking.h"
#include "common/clock.h"
#include "common/layout.h"
#include "common/schedule.h"
#include "common/thread_pool.h"
#include "common/unchanged.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/checkpoint.h"
#include "server/checkpoint_writer.h"
#include "server/lease_table.h"
#include "server/metrics.h"
#include "server/model_install.h"
#include "server/gradient_presence.h"
#include "server/optimizer.h"
#include "server/round_hyper.h"
#include "server/pull_waiters.h"
#include "server/replica_tracker.h"
#include "server/round.h"
#include "server/round_diagnostics.h"
#include "server/round_policy.h"
#include "server/shard_config.h"

namespace pserver {

// What a shard runs on; every field may be null for the defaults.
struct ShardEnv {
  ServerMetrics* metrics = nullptr;  // null: an unexported sink
  const Clock* clock = nullptr;      // null: the real clock
  ThreadPool* pool = nullptr;        // null: ThreadPool::Default()
};

// Thread-safe: every public method may be called concurrently.
class Shard {
 public:
  // Loads the newest usable checkpoint when config.checkpoint_dir is set.
  // The env's objects must outlive the shard.
  static absl::StatusOr<std::unique_ptr<Shard>> Create(const ShardConfig& config,
                                                       ShardEnv env);
  static absl::StatusOr<std::unique_ptr<Shard>> Create(
      const ShardConfig& config, ServerMetrics* metrics) {
    return Create(config, ShardEnv{metrics});
  }

  // Joins a worker; the first call sets layout and initial weights.
  // INVALID_ARGUMENT for malformed fields, FAILED_PRECONDITION for a layout,
  // shard or worker count that disagrees with the shard's,
  // RESOURCE_EXHAUSTED for a model above the configured limits.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Takes one chunk of one worker's push for the current step. Sums it
  // (and any queued chunks it unblocks) on the calling thread when it is
  // the chunk's next in worker order, and for the round's last chunk runs
  // the optimizer, so it may block that long. Returns duplicate=true for a
  // (worker, step, chunk) already received, and round_lost=true for a step
  // this shard skipped when a worker resumed past it (nothing is applied).
  // When the chunk was queued (*queued set true), `on_summed` runs exactly
  // once, without the shard's lock, when the chunk has been summed or
  // dropped (possibly before Push returns); otherwise it never runs. The
  // transport answers the call only then, so the chunks a worker has in
  // flight bound what the shard holds for it. The request is kept, not
  // copied, until then.
  absl::StatusOr<v1::PushResponse> Push(
      std::shared_ptr<v1::PushRequest> req,
      std::function<void()> on_summed, bool* queued) ABSL_LOCKS_EXCLUDED(mu_);
  // For tests and tools: a copy of `req`, nothing to notify.
  absl::StatusOr<v1::PushResponse> Push(const v1::PushRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Answers a pull through `done`, exactly once: at once when the step is
  // available, or when its round completes, or with an error. A waiting pull
  // is registered under the returned id (0: answered already);
  // CancelPull(id) answers it with `why` if it is still waiting. `done` runs
  // without the shard's lock held.
  uint64_t Pull(const v1::PullRequest& req, PullDone done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CancelPull(uint64_t id, absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocking form for tests and tools: waits up to `timeout`.
  absl::StatusOr<v1::PullResponse> PullBlocking(const v1::PullRequest& req,
                                                absl::Duration timeout);

  absl::StatusOr<v1::GetFrozenVarianceResponse> GetFrozenVariance(
      const v1::GetFrozenVarianceRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // The shard's checkpoint bytes in chunks, out (a worker's state_dict())
  // and in (a fresh job resuming from one): server/shard_transfer.cc.
  absl::StatusOr<v1::GetShardStateResponse> GetShardState(
      const v1::GetShardStateRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::InstallShardStateResponse> InstallShardState(
      const v1::InstallShardStateRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // What the shard holds now. The checksum of the big arrays is computed at
  // most once per change of them, however often this is called.
  v1::GetStatusResponse Status() ABSL_LOCKS_EXCLUDED(mu_);

  bool registered() ABSL_LOCKS_EXCLUDED(mu_);
  // Checksum64 of step, weights, optimizer moments, replica and the round's
  // bookkeeping.
  uint64_t StateChecksum() ABSL_LOCKS_EXCLUDED(mu_);

  // Takes a worker out of the rounds at once (server/shard_leases.cc).
  absl::StatusOr<v1::LeaveResponse> Leave(const v1::LeaveRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops workers whose lease expired now (the background reaper calls it
  // every min(1 s, timeout / 4)); tests with a FakeClock call it directly.
  void CheckLeases() ABSL_LOCKS_EXCLUDED(mu_);

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

  // ssp: ends the round's patience for its cohort when its deadline
  // passed (the round timer calls it; tests with a FakeClock call it
  // directly).
  void CheckPatience() ABSL_LOCKS_EXCLUDED(mu_);

  // For tests: times Status() hashed the big arrays.
  uint64_t status_hashes() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Ready = std::function<void()>;

  Shard(const ShardConfig& config, ShardEnv env,
        std::unique_ptr<ReplicaTracker> replica);

  absl::Status CheckWorker(uint32_t worker_id) const;
  // INVALID_FIELD naming the slice's chunk count unless chunk c exists.
  absl::Status CheckChunk(uint32_t c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether pushes must carry the workers' momentum now (1-bit Adam's
  // compression stage, --onebit_momentum=worker, a decay > 0).
  bool ExpectsMomentum() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The compression schedule's phase of round `step` (0 without one).
  uint32_t PhaseAt(uint64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The schedule resolved for a run of total_steps rounds (nullopt without
  // a schedule); a Register's refusal when it cannot be.
  absl::StatusOr<std::optional<ResolvedSchedule>> ResolveSchedule(
      uint64_t total_steps) const;
  // Register's checks that need no state; on success *slots is the layout.
  absl::Status CheckRegisterRequest(const v1::RegisterRequest& req,
                                    std::vector<TensorSlot>* slots) const;
  // Takes a chunked Register's chunk (server/model_install.h); true once
  // the model is installed. `slots` is the request's layout (consumed).
  absl::StatusOr<bool> InstallChunk(const v1::RegisterRequest& req,
                                    std::vector<TensorSlot> slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InstallModel(const v1::ModelLayout& layout,
                    const std::vector<TensorSlot>& slots, std::vector<float> x)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a checkpoint or an installed state must match (this config).
  CheckpointExpectation Expectation() const;
  // Takes the installing Register's betas / eps where the flags left them
  // out; CONFIG_MISMATCH naming both for any other value (nothing changed).
  absl::Status AdoptAdamHyper(const v1::RegisterRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestoreFrom(ShardState state) ABSL_LOCKS_EXCLUDED(mu_);
  // RestoreFrom's commit, after its checks.
  void CommitState(ShardState st, const std::vector<TensorSlot>& slots,
                   std::optional<ResolvedSchedule> schedule)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty when a state of `step` and replica `checksum` may be installed
  // (no rounds completed or pushed yet: *current false) or is what the
  // shard holds already (*current true); else STATE_MISMATCH.
  absl::Status CheckInstall(uint64_t step, uint64_t checksum, bool* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No rounds of its own yet (no model, or step 0 with nothing pushed): it
  // takes any state (GetStatusResponse.takes_state announces it).
  bool TakesStateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ShardState CaptureState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FastForward(uint64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The learning-rate gauges, one per group: what a round stepped with, or
  // (after an install or restore) what the schedule gives round step_.
  void PublishLearningRates(const std::vector<GroupHyper>& hyper);
  // Sums queued pushes in worker-id order, releasing mu_ while decoding;
  // completes the round when the last is in. Returns the pulls to answer.
  std::vector<Ready> Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the round in progress waits for worker w (the policy's rule).
  bool WaitsFor(uint32_t w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The version worker w's next push will be computed on: the step it
  // pulled, or the round after its latest push's (its pull waits for it).
  uint64_t CurrentVersion(uint32_t w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::max<uint64_t>(version_[w],
                              static_cast<uint64_t>(landed_[w] + 1));
  }
  // The refusal of a push from worker w, dropped from the rounds.
  absl::Status DroppedWorker(uint32_t w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WRONG_SPACE unless the push's gradient space and momentum flag are what
  // the optimizer's stage expects now; INVALID_FIELD for malformed
  // hyper-parameters, HYPER_MISMATCH (bsp) for ones that differ from the
  // round's (server/round_hyper.h).
  absl::Status CheckForm(const v1::PushRequest& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push's checks and bookkeeping under bsp: on success the chunk was
  // queued (*queued) or the response says why not (duplicate, round_lost).
  // `wire_bytes`: the push's payload as it came (before FillUnchanged).
  absl::Status PushSynchronous(std::shared_ptr<v1::PushRequest>& request,
                               const ValidatedTensor& valid,
                               uint64_t wire_bytes,
                               std::function<void()>& on_summed, bool* queued,
                               v1::PushResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT unless every CODEC_UNCHANGED piece of chunk c's push
  // lies in buffer tensors (common/unchanged.h).
  absl::Status CheckUnchanged(const v1::EncodedTensor& t, uint32_t c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT unless every CODEC_NO_GRADIENT piece lies in parameter
  // tensors.
  absl::Status CheckNoGradient(const v1::EncodedTensor& t, uint32_t c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The refusal of chunk c's `piece`: "<what> over element E of tensor 'n',
  // <kind>; expected <what> only over <over> tensors".
  absl::Status RefusePiece(uint32_t c, const OutsidePiece& piece,
                           const char* what, const char* kind,
                           const char* over) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The push's unchanged pieces become fp32 of the replica's values (what
  // the worker holds and would have sent), and *valid the token of the
  // result.
  absl::Status FillUnchanged(v1::PushRequest* req, ValidatedTensor* valid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push's checks and bookkeeping under ssp and async (stale tags, pushes
  // deferred to the next round); the request is consumed when queued.
  absl::Status PushRelaxed(std::shared_ptr<v1::PushRequest>& request,
                           const ValidatedTensor& valid, uint64_t wire_bytes,
                           std::function<void()>& on_summed, bool* queued,
                           v1::PushResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues worker w's chunk c into the round in progress (staleness from
  // its tag), noting its arrival.
  void Land(uint32_t w, uint32_t c, Round::Push push, uint64_t tag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The round and the pushes deferred to the next one dropped; their
  // acknowledgements returned.
  std::vector<Ready> ClearRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the next round: its clock, patience and the deferred pushes.
  void OpenRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The median of the newest rounds' durations (zero before the first).
  absl::Duration RecentRoundDuration() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // The next time the round timer has something to do (InfiniteFuture:
  // none).
  absl::Time NextTimerEvent() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Steps the summed round; `total`: its squared mean norm, for a round of
  // clipped pushes (server/shard_clip.cc).
  std::vector<Ready> CompleteRound(std::optional<double> total = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Mean clipping (PushRequest.clip_norm; server/shard_clip.cc): a push's
  // clip_norm against the round's; a summed clipped round held until a
  // pull brings its total (true: held, don't complete it); a pull's
  // norm_part or round_squared_norm, answered or parked (*answer / *ready
  // set, or an error), else nothing done (false).
  absl::Status CheckClip(const v1::PushRequest& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HoldForClip(std::vector<Ready>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PullForClip(const v1::PullRequest& req, PullDone* done,
                   absl::Status* error, PullAnswer* answer, uint64_t* parked,
                   std::vector<Ready>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PullAnswer NormPartAnswer(uint64_t step, double part) const;
  // Scales the parameters of the round's mean by torch's clip coefficient
  // for its squared norm `total`, and records the round as clipped.
  void ClipMean(absl::Span<float> mean, double total)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard's parameter ranges (the complement of buffers_).
  ElementRanges ParameterRanges() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Ready> WakeWaiters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PullAnswer AnswerPull(const v1::PullRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Ready> ReapLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReaperLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void PublishLiveness() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t StateChecksumLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t RegisteredCount() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardConfig config_;
  std::unique_ptr<ServerMetrics> own_metrics_;  // when env.metrics is null
  ServerMetrics* const metrics_;
  const Clock* const clock_;
  ThreadPool* const pool_;
  const RoundPolicy policy_;

  absl::Mutex mu_;
  // config_.optimizer with the betas and eps the job runs (the flags', or
  // the first worker's optimizer's, or a restored state's).
  OptimizerConfig opt_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  // Since this incarnation started, no round has completed: the shard may
  // be behind its workers (restart), so a Register may fast-forward it.
  bool catching_up_ ABSL_GUARDED_BY(mu_) = true;
  v1::ModelLayout layout_ ABSL_GUARDED_BY(mu_);
  std::vector<TensorSlot> slots_ ABSL_GUARDED_BY(mu_);  // layout_'s tensors
  // The schedule phase of the replica's per-tensor pull codecs (-1: none).
  int64_t pull_plan_phase_ ABSL_GUARDED_BY(mu_) = -1;
  // A chunked installation in progress (before registered_).
  std::unique_ptr<ModelInstall> install_ ABSL_GUARDED_BY(mu_);
  ShardRange range_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> worker_registered_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::vector<float> x_ ABSL_GUARDED_BY(mu_);  // weights
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;     // completed rounds
  // Last step each worker's push was received for (-1: none).
  std::vector<int64_t> last_pushed_ ABSL_GUARDED_BY(mu_);
  // The latest rounds this incarnation skipped by fast-forwarding,
  // [lost_from_, lost_to_) (empty when equal): a late push for one of them
  // is acknowledged with round_lost, not refused as never pushed, because
  // other workers resumed past it while this one was still resending it.
  uint64_t lost_from_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t lost_to_ ABSL_GUARDED_BY(mu_) = 0;  // != 0: it fast-forwarded
  // Local steps between the job's pushes (RegisterRequest.local_steps; 1
  // for a push per step), set by the model's installer and checkpointed.
  uint32_t local_steps_ ABSL_GUARDED_BY(mu_) = 1;
  // Per worker, for ssp and async (server/round_policy.h): the round its
  // last push landed in (-1: none; step_ + 1 when deferred), the version
  // it computes on (the step of its last pull or Register), whether it is
  // late (server/round_policy.h), and its push deferred to the next round
  // (by chunk; its tag is last_pushed_).
  std::vector<int64_t> landed_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> version_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> late_ ABSL_GUARDED_BY(mu_);
  std::vector<std::map<uint32_t, Round::Push>> deferred_ ABSL_GUARDED_BY(mu_);
  // The round in progress opened (the previous one completed); the offsets
  // of its workers' first chunks from then; its patience's end and whether
  // it passed; deadline_seq_ changes when the deadline does (wakes the
  // timer).
  absl::Time round_open_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> arrivals_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool patience_over_ ABSL_GUARDED_BY(mu_) = false;
  // When the round stops waiting for workers at the bound, whether it did,
  // and the durations of the newest kDurationsKept rounds, whose median
  // sets it (RecentRoundDuration: a median, so the first rounds, which
  // include the workers' start, stop counting after a few).
  absl::Time release_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<absl::Duration> round_durations_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kDurationsKept = 15;
  // The patience deadlines of recent rounds (round, deadline; the newest
  // kDeadlinesKept): a late worker whose push arrives before the deadline
  // of the round it was computed for is on time again.
  std::deque<std::pair<uint64_t, absl::Time>> deadlines_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kDeadlinesKept = 64;
  uint64_t deadline_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool timer_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<std::thread> timer_;
  // config_.schedule resolved for the job's run length (set with the
  // model: by its installer's Register, or from a checkpoint).
  std::optional<ResolvedSchedule> schedule_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<ReplicaTracker> replica_ ABSL_PT_GUARDED_BY(mu_);
  Round round_ ABSL_GUARDED_BY(mu_);
  RoundHyper hyper_ ABSL_GUARDED_BY(mu_);  // the round's hyper-parameters
  // The slice's broadcast buffers (slice-local [begin, end), in order).
  std::vector<std::pair<uint64_t, uint64_t>> broadcast_ ABSL_GUARDED_BY(mu_);
  // The slice's buffer tensors (common/unchanged.h BufferRanges).
  ElementRanges buffers_ ABSL_GUARDED_BY(mu_);
  // The round's tensors with a gradient (no push had one: not stepped).
  GradientPresence presence_ ABSL_GUARDED_BY(mu_);
  // The round's clip_norm (0: none); once its pushes are summed, its part
  // of the squared mean norm, held for the total; the last clipped round.
  float round_clip_ ABSL_GUARDED_BY(mu_) = 0.0f;
  bool clip_held_ ABSL_GUARDED_BY(mu_) = false;
  double clip_part_ ABSL_GUARDED_BY(mu_) = 0.0;
  int64_t clipped_step_ ABSL_GUARDED_BY(mu_) = -1;
  double clipped_part_ ABSL_GUARDED_BY(mu_) = 0.0;
  absl::Time round_start_ ABSL_GUARDED_BY(mu_);
  // Stragglers and update blow-ups (server/round_diagnostics.h).
  RoundDiagnostics diagnostics_ ABSL_GUARDED_BY(mu_);
  // When the norm gauges were last computed (CompleteRound).
  absl::Time norms_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  static constexpr absl::Duration kNormsPeriod = absl::Seconds(1);
  PullWaiters waiters_ ABSL_GUARDED_BY(mu_);
  // Per worker: a GetShardState capture being read, and the bytes of an
  // InstallShardState received so far (server/shard_transfer.cc).
  struct Transfer {
    uint64_t step = 0;
    uint64_t checksum = 0;
    std::string bytes;
  };
  std::map<uint32_t, Transfer> exports_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, Transfer> imports_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);
  // Status(): the checksum of x, x_hat, m and v, valid while
  // arrays_version_ == hashed_version_.
  uint64_t arrays_version_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t hashed_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t arrays_hash_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t status_hashes_ ABSL_GUARDED_BY(mu_) = 0;

  bool reaper_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<std::thread> reaper_;
  std::unique_ptr<CheckpointWriter> writer_;  // set in Create, then const
  std::vector<std::string> startup_log_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_SHARD_H_
