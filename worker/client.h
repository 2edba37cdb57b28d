// The client library: what a worker's training loop calls to train through
// pserver. It connects to every shard, registers the model, and per step
// pushes the worker's flat gradient and returns the next weights.
//
// A thin coordinator over one component per concept:
//   worker/shard_calls.h    the RPCs to the shards: deadlines, retries
//   worker/push_encoder.h   one shard's push: codec per stage, error
//                           feedback, 1-bit Adam's preconditioner
//   worker/replica.h        the replica x̂: pulled deltas and snapshots,
//                           checksums, all-or-nothing updates
//   worker/recovery.h       what to do when a shard refuses a call, decided
//                           on the shard's reason
//   worker/client_metrics.h bytes, retries, rejoins: ClientStats and the
//                           worker's Prometheus counters
//
// Per step it encodes every shard's slice of the gradient and pushes all
// shards in parallel, then pulls all shards in parallel and applies the
// answers to the replica only when every shard's answer verified against its
// checksum (a mismatch is re-pulled as a snapshot). A shard that lost this
// worker or this step (it restarted) is registered with again and pushed
// again; a misconfiguration (wrong gradient space, codec, layout, worker
// count) fails the step at once with the shard's message.
//
// Usage:
//   ClientOptions o;
//   o.server_addresses = {"127.0.0.1:50051", "127.0.0.1:50052"};
//   o.worker_id = 0; o.num_workers = 4;
//   auto client = Client::Connect(o);                 // no RPC yet
//   (*client)->Register(layout, initial_weights);     // replica = weights
//   for (...) {
//     Compute(client->weights(), grad);
//     (*client)->Step(grad);                          // replica advanced
//   }
#ifndef PSERVER_WORKER_CLIENT_H_
#define PSERVER_WORKER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/chunking.h"
#include "common/layout.h"
#include "common/schedule.h"
#include "common/tls.h"
#include "common/unchanged.h"
#include "prometheus/registry.h"
#include "pserver/v1/parameter_server.pb.h"
#include "worker/client_metrics.h"
#include "worker/client_options.h"
#include "worker/preconditioner.h"
#include "worker/push_encoder.h"
#include "worker/ready_chunks.h"
#include "worker/recovery.h"
#include "worker/replica.h"
#include "worker/shard_calls.h"

namespace pserver {

// One shard's whole state (server/checkpoint.h's bytes) as GetShardState
// gave it, with the step and replica checksum it is of.
struct ShardStateCopy {
  uint64_t step = 0;
  uint64_t replica_checksum = 0;
  std::string bytes;
};

// Thread-compatible: one training loop drives one Client.
class Client {
 public:
  // Creates channels to every shard. Does not contact them (gRPC connects
  // lazily). INVALID_ARGUMENT for an empty address list or bad ids.
  // The client's counters are added to `registry` (worker/client_metrics.h);
  // nullptr: they are kept but not exported.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options, prometheus::Registry* registry = nullptr);
  ~Client();

  // Registers this worker with every shard: the first worker's
  // `initial_weights` initialise the model; everyone then pulls (nothing
  // from a shard whose weights are its initial_weights already, a snapshot
  // from any other), so on return weights() holds the shards' current replica and step() the
  // shards' current step. If a previous incarnation of this worker crashed
  // after pushing to only some shards, those are one step ahead: step() is
  // then the other shards' step, and the next Step()'s push to the ahead
  // shards is acknowledged as a duplicate (their slice of the replica is
  // already newer and resyncs by snapshot). Blocks on one Register and one
  // Pull per shard, retrying while shards are unavailable (for up to
  // retry_budget). Shards whose steps disagree (another worker installing a
  // saved state into them one by one) are waited for, as long.
  // REQUIRES: initial_weights.size() == TotalElements(layout).
  // FAILED_PRECONDITION when the shards' layout or configuration differs.
  absl::Status Register(const v1::ModelLayout& layout,
                        absl::Span<const float> initial_weights);

  // The run's length in rounds (pushes), sent at Register: a schedule with
  // fractional bounds needs it, and the shards refuse a worker whose run
  // length differs from the job's. 0 (the default): unknown.
  void SetRunLength(uint64_t rounds) { run_length_ = rounds; }
  const ClientOptions& options() const { return options_; }
  // The compression schedule's phase of the next push (0 without one).
  uint32_t schedule_phase() const { return phase_; }

  // Pushes `gradient` (the full flat gradient at weights()) for step(), then
  // waits for every shard's next weights and advances the replica. Blocks on
  // the slowest worker of the round. On return step() has advanced by one
  // and weights() holds the new replica. A non-finite gradient is refused
  // with INVALID_ARGUMENT before anything is sent (residuals unchanged).
  // When a shard call fails weights() and step() are unchanged (hole 7); a shard
  // refusal that re-registering cannot fix (worker/recovery.h) is returned
  // at once with the shard's message and reason.
  // REQUIRES: Register() succeeded; gradient.size() == num_params().
  // `no_gradient`: the layout indices, increasing, of parameter tensors
  // without a gradient this step (torch's `.grad` None), sent as
  // CODEC_NO_GRADIENT with their residuals and momentum kept; a tensor no
  // worker had one for is not updated (codec.proto). INVALID_ARGUMENT,
  // nothing sent, for an index out of range, out of order or a buffer's.
  // `overflow`: the caller's loss scaler found an inf or NaN in this
  // gradient (GradScaler under fp16). Every parameter tensor goes as no
  // gradient, its values unread (buffers as usual, checked finite), and the
  // push says so: the round updates no parameter, for any worker, and
  // round_skipped() says so afterwards on every worker of the round.
  absl::Status Step(absl::Span<const float> gradient,
                    absl::Span<const uint32_t> no_gradient = {},
                    bool overflow = false);
  // Whether the round of the last step updated nothing because a worker
  // reported an overflow (PullResponse.round_skipped).
  bool round_skipped() const {
    return round_skipped_.load(std::memory_order_relaxed);
  }

  // Step, overlapped with the caller's backward pass (DDP's buckets on a
  // parameter server): the caller hands the gradient over in pieces as they
  // are final, and the chunks they complete are encoded and pushed on a
  // background thread while it computes the rest.
  //   client->StartStep(grad);           // grad: the flat buffer backward fills
  //   ... backward writes grad[b, e) ...; client->GradientReady(b, e);
  //   ...                                // per tensor or bucket, any order
  //   client->FinishStep();              // hands over the rest, pushes, pulls
  // The result is Step(grad)'s, bit for bit. Until FinishStep returns,
  // `gradient` must stay alive and a range handed over must not change;
  // no other method may be called but GradientReady and FinishStep.
  // StartStep: as Step's checks (FAILED_PRECONDITION while a step is in
  // progress). GradientReady: INVALID_ARGUMENT (nothing handed over) for an
  // empty range, one outside the gradient or overlapping an earlier one,
  // or non-finite values. FinishStep: INVALID_ARGUMENT, the step still in
  // progress, when a range not handed over holds a non-finite value or
  // `no_gradient` (as Step's) is refused; then as Step. Tensors in it must
  // not have been handed over.
  absl::Status StartStep(absl::Span<const float> gradient);
  absl::Status GradientReady(uint64_t begin, uint64_t end);
  absl::Status FinishStep(absl::Span<const uint32_t> no_gradient = {});
  bool in_step() const { return pusher_.joinable(); }

  // The hyper-parameters every push carries from now on
  // (PushRequest.hyper): one per layout group, e.g. a PyTorch scheduler's
  // learning rate and weight decay, or none (the shards' own schedule and
  // the groups' weight decay). Every worker of a round must send the same.
  // FAILED_PRECONDITION before Register() or during a step;
  // INVALID_ARGUMENT (nothing changed) for another count than the layout's
  // groups or a value that is not finite and >= 0.
  absl::Status SetHyper(std::vector<v1::HyperParams> hyper);
  // Clip each round's mean gradient to this global L2 norm on the shards
  // (PushRequest.clip_norm; DDP's clipping), 0: none. Every worker must set
  // the same; each step then pulls every shard's part of the norm first.
  // FAILED_PRECONDITION during a step; INVALID_ARGUMENT unless finite >= 0.
  absl::Status SetClipNorm(float max_norm);
  // The push codec in use: push_codec, or the job's when that is
  // unspecified (after Register()).
  v1::Codec push_codec() const { return push_codec_; }
  // Shard 0's optimizer configuration (RegisterResponse); empty before
  // Register().
  const v1::OptimizerSettings& shard_settings() const { return settings_; }

  // The replica: the weights every worker holds for step().
  absl::Span<const float> weights() const { return replica_.weights(); }
  // The step of the replica. Under the shards' --consistency=ssp or async
  // each shard's slice has its own step and this is the lowest; it may
  // advance by more than one per Step() (the shards went on meanwhile).
  uint64_t step() const { return replica_.step(); }
  // What the shards' rounds wait for (RegisterResponse.consistency).
  v1::Consistency consistency() const { return consistency_; }
  uint64_t num_params() const { return replica_.weights().size(); }
  // COMPRESSION once every shard is in 1-bit Adam's compression stage.
  v1::OptimizerStage stage() const;
  const ClientStats& stats() const { return metrics_.stats(); }
  // L2 norm of all shards' push error-feedback residuals together.
  double ResidualNorm() const;

  // Saves this worker's error-feedback residuals (every shard, both stages)
  // to `path` atomically, so a restarted worker loses none of the gradient
  // mass it has not sent yet. Format: worker/client_state.cc.
  absl::Status SaveState(const std::string& path) const;
  // Loads residuals saved by SaveState, after Register(). Refused (state
  // unchanged) when the file is corrupt or was written for another worker
  // id, worker count, shard layout or model size. Without it a restarted
  // worker starts with zero residuals, as DeepSpeed does on reload.
  absl::Status LoadState(const std::string& path);
  // The same record as bytes, for callers that keep it themselves (the
  // Python package's state_dict()). FAILED_PRECONDITION before Register().
  absl::StatusOr<std::string> SerializeState() const;
  // Restores a record from SerializeState() or a SaveState() file, with
  // LoadState's checks; `source` names the record in error messages.
  absl::Status RestoreState(absl::string_view record, absl::string_view source);
  // Every shard's whole state (weights, optimizer moments, step, stage,
  // replica), fetched now, in shard order: what an optimizer checkpoint
  // needs beyond this worker's record. Blocks on every shard's chunks
  // (worker/client_transfer.cc). FAILED_PRECONDITION before Register() or
  // during a step.
  absl::StatusOr<std::vector<ShardStateCopy>> FetchShardStates();
  // Puts `states` (FetchShardStates' of the same model and shard count) on
  // the shards, then registers again so the replica and step() are the
  // shards'. A shard already at a state's step with its replica is left as
  // it is; one with no rounds yet (a fresh job) takes it: worker 0 sends it,
  // the other workers wait (up to retry_budget) until it is there. Shards
  // of a running job past the states' step (the job went on while this
  // worker was away: rounds since they started, or a skip to the workers'
  // step) keep theirs, and so do the shards beside them that hold a model
  // of another step (restored from a checkpoint): shards_ahead, nothing
  // changed; the rounds skip those to their step. Any other
  // shard is refused before anything changes: FAILED_PRECONDITION
  // (REJECT_REASON_STATE_MISMATCH) naming the shard and both steps. On
  // success residuals start from zero (restore them with RestoreState).
  struct InstallOutcome {
    int installed = 0;          // shards this call installed
    bool shards_ahead = false;  // the running job's state was kept
  };
  absl::StatusOr<InstallOutcome> InstallShardStates(
      const std::vector<ShardStateCopy>& states);

  // Takes this worker out of the job's rounds on every shard, between
  // steps (it was told to stop: a spot machine's notice): the shards go on
  // without it at once, and do not count it as dropped. Register() brings
  // it back, from the next round. Returns the shards' step. Every shard is
  // asked even when one fails; the first failure is returned, naming its
  // shard. FAILED_PRECONDITION before Register() or during a step.
  absl::StatusOr<uint64_t> Leave();

 private:
  // The push of the step in progress, for resending it after a rejoin
  // (its encoded chunks are in sent_).
  struct PendingPush {
    absl::Span<const float> gradient;
    double bound = -1.0;  // max |gradient[i]| (GradientBound()), or unknown
  };

  Client(const ClientOptions& options, prometheus::Registry* registry);
  // One attempt of Register; sets moved_ when the shards' steps were too
  // far apart or a shard is at step 0 behind the others (possibly an
  // installation under way): Register then waits and tries again.
  absl::Status RegisterOnce(const v1::ModelLayout& layout,
                            absl::Span<const float> initial_weights);
  // Step's and StartStep's checks (`what` names the call).
  absl::Status CheckStepStart(const char* what,
                              absl::Span<const float> gradient) const;
  // INVALID_ARGUMENT naming the first non-finite value (its index in the
  // gradient is offset + i); when all are finite, *max_abs is their largest
  // |value| (the same pass).
  static absl::Status CheckGradientFinite(absl::Span<const float> values,
                                          uint64_t offset, double* max_abs);
  // Raises GradientBound() to at least `max_abs` (a checked range's).
  void NoteGradientBound(double max_abs);
  // CheckGradientFinite over step_gradient_[begin, end), its max |value|
  // noted: what a range must pass before it is marked ready.
  absl::Status CheckReadyRange(uint64_t begin, uint64_t end);
  // The largest |value| over the ranges of this step's gradient checked so
  // far: a chunk is encoded only once its range is checked, so this bounds
  // it, and the encoder need not take a pass of its own to find that.
  double GradientBound() const;
  // FinishStep once no_gradient_ is set.
  absl::Status FinishStepNow();
  // Mean clipping: the round's squared mean norm, every shard's part of
  // round `step - 1` pulled and added in shard order.
  // On failure also the first failing shard and its refusal as it came
  // (with the shard's reason, for RecoveryFor).
  absl::StatusOr<double> RoundSquaredNorm(uint64_t step, absl::Status* refused,
                                          size_t* shard);
  // Step's `no_gradient` as slice-local ranges per shard, or
  // INVALID_ARGUMENT naming the entry.
  absl::StatusOr<std::vector<ElementRanges>> NoGradientRanges(
      absl::Span<const uint32_t> tensors) const;
  // Fills req with chunk c of shard s's slice of `gradient`, encoded (the
  // residual of that piece moves on), and keeps a lossy encoding in sent_.
  // `bound`: an upper bound of |gradient[i]|, or negative when unknown.
  absl::Status EncodeChunk(size_t s, uint32_t c,
                           absl::Span<const float> gradient, double bound,
                           v1::PushRequest* req);
  // The chunk_elements shard s announced; FAILED_PRECONDITION when out of
  // the bounds in common/chunking.h.
  absl::StatusOr<uint64_t> AnnouncedChunking(
      size_t s, const v1::RegisterResponse& resp) const;
  // Sets plans_[s]'s chunk_elements to what shard s announced.
  absl::Status SetChunking(size_t s, const v1::RegisterResponse& resp);
  // Carries out `recovery` for shard s, which refused a call of the step in
  // progress: registers again (and for kRejoinAndResend pushes `push` again,
  // re-encoded if the shard's stage changed). The shard is then pulled as a
  // snapshot. kFail never gets here.
  // Returns the shard's step after registering again.
  // A refusal of the resend that registering again fixes (the shard failed
  // again meanwhile) is recovered again, up to 4 times in all.
  absl::StatusOr<uint64_t> Recover(size_t s, Recovery recovery,
                                   const PendingPush& push);
  absl::StatusOr<uint64_t> RecoverOnce(size_t s, Recovery recovery,
                                       const PendingPush& push);
  // Pushes the step's chunks to shard s again: those sent are resent
  // unchanged (a duplicate is answered as one), those never encoded are
  // encoded now; `reencode`: every chunk anew (the shard's stage changed).
  absl::Status Resend(size_t s, bool reencode, const PendingPush& push);
  // After a pull of the step in progress was answered with a later step (a
  // synchronous run went on without this worker): registers again with
  // every shard and pulls their current step as Register does. The step's
  // push is lost on the shards that went on (its residual stays).
  absl::Status Resync();
  // At Register, before joining: while some shard has no model and another
  // has completed rounds (the first lost its state before its first
  // checkpoint), waits up to retry_budget for a worker holding the rounds'
  // weights to reinstall it, instead of installing initial weights there.
  absl::Status AwaitLostModels();
  // At Register: a shard more than one step behind the others (restored
  // from a checkpoint behind them) is registered again with resume_step at
  // the others' step, so that it skips there. Updates *resps. A shard at
  // step 0 is not: it sets moved_ and fails (a state may be being
  // installed into it).
  absl::Status CatchUpLaggingShards(std::vector<v1::RegisterResponse>* resps);
  // Pulls `step` from every shard (snapshot[s]: a full snapshot from shard
  // s) and commits the answers to the replica only when all verified; a
  // checksum mismatch is re-pulled as a snapshot. `push` is the step's push
  // for recovery; nullptr at Register, where any refusal fails. On error the
  // replica is unchanged.
  absl::Status PullAll(uint64_t step, std::vector<bool> snapshot,
                       const PendingPush* push);
  // ABORTED when shard s answered another step than `step` (a snapshot one
  // step ahead is accepted at Register, see there; *ahead says so).
  absl::Status CheckAnswer(size_t s, uint64_t step, bool registering,
                           const v1::PullResponse& resp, bool* ahead) const;
  // Registers again with shard s after it restarted or dropped this worker:
  // resume_step (0: none) lets a shard that lost rounds catch up, and the
  // replica's slice stands in for initial weights if it lost its model.
  // Follows the shard's stage. Returns the shard's step after registering.
  absl::StatusOr<uint64_t> Rejoin(size_t s, uint64_t resume_step);
  // What moving shard s's encoder to `stage` needs from the shard first:
  // the frozen preconditioner when it enters the compression stage.
  absl::StatusOr<std::optional<Preconditioner>> PrepareStage(
      size_t s, v1::OptimizerStage stage);
  absl::Status SetStage(size_t s, v1::OptimizerStage stage);
  // Moves shard s's encoder to the push codecs of schedule phase `phase`
  // (its per-tensor codecs included; without a schedule, the plan of the
  // slice's tensors), as the shard announced it; FAILED_PRECONDITION for a
  // phase the schedule does not have (or any but 0 without one).
  absl::Status SetPhase(size_t s, uint32_t phase);
  absl::Status CheckPhase(size_t s, uint32_t phase) const;
  // A chunked Register of shard s, without weights.
  v1::RegisterRequest RegisterRequestFor(size_t s, uint64_t resume_step) const;
  // For each shard in `shards` whose (*resps)[s] says the model is not
  // ready (this worker installs it), sends slice(s) chunk by chunk; the
  // completing call's answer replaces (*resps)[s].
  absl::Status SendWeights(
      const std::vector<size_t>& shards,
      absl::FunctionRef<absl::Span<const float>(size_t)> slice,
      uint64_t resume_step, std::vector<v1::RegisterResponse>* resps);

  const ClientOptions options_;
  ClientMetrics metrics_;
  std::unique_ptr<ShardCalls> calls_;
  std::vector<std::unique_ptr<PushEncoder>> encoders_;  // per shard
  std::vector<ChunkPlan> plans_;                         // per shard
  // Per shard: the step's encoded chunks, kept to resend them unchanged to
  // a shard that restarted (a lossy codec's residual has moved on); an
  // fp32 chunk is not kept (re-encoding it gives the same bytes), nor one
  // not encoded in this step (cleared at StartStep).
  std::vector<std::vector<v1::EncodedTensor>> sent_;
  std::vector<v1::GradientSpace> sent_space_;
  std::vector<uint8_t> sent_momentum_;  // the kept chunks' .momentum
  // The step in progress (StartStep .. FinishStep): the caller's gradient,
  // which chunks are ready, and the thread pushing them. The pusher owns
  // encoders_, sent_ and the push counters of metrics_ until it is joined.
  absl::Span<const float> step_gradient_;
  // GradientBound()'s float bits (|x|'s bits order as the values do);
  // reset at StartStep. Written by the caller's thread before it marks a
  // range ready, read by the pusher after it took a ready chunk: ready_'s
  // mutex orders the two.
  std::atomic<uint32_t> gradient_bound_bits_{0};
  ReadyChunks ready_;
  // The step's tensors without a gradient, per shard (slice-local): cleared
  // at StartStep, set by FinishStep before it marks the rest ready.
  absl::Mutex no_gradient_mu_;
  std::vector<ElementRanges> no_gradient_ ABSL_GUARDED_BY(no_gradient_mu_);
  bool overflow_ ABSL_GUARDED_BY(no_gradient_mu_) = false;  // Step's
  std::atomic<bool> round_skipped_{false};  // set by the pulls' callbacks
  std::thread pusher_;
  std::vector<absl::Status> pushed_;  // per shard, set by the pusher
  // Per shard: its push stopped because another shard's failed first
  // (ShardCalls' `interrupted`); resent once that one is recovered.
  std::vector<bool> push_interrupted_;
  absl::Duration encoding_;
  absl::Time push_start_;
  Replica replica_;
  bool registered_ = false;
  v1::Codec push_codec_ = v1::CODEC_UNSPECIFIED;
  bool moved_ = false;  // RegisterOnce: the shards' steps were far apart
  v1::ModelLayout layout_;
  // SetHyper's values and SetClipNorm's, sent with every push chunk; the
  // step's squared mean norm, sent with its weights pulls.
  google::protobuf::RepeatedPtrField<v1::HyperParams> hyper_;
  float clip_norm_ = 0.0f;
  std::optional<double> round_norm_sq_;
  v1::OptimizerSettings settings_;
  std::vector<TensorSlot> slots_;  // layout_'s tensors in the flat space
  // Per shard, the schedule phase whose per-tensor codecs its encoder has
  // (-1: none yet).
  std::vector<int64_t> tensor_plan_phase_;
  uint64_t run_length_ = 0;
  uint32_t phase_ = 0;  // the schedule phase shard 0 announced last
  v1::Consistency consistency_ = v1::CONSISTENCY_BSP;
  // Under ssp and async: pulls are answered with the shards' newest step.
  bool relaxed() const {
    return consistency_ == v1::CONSISTENCY_SSP ||
           consistency_ == v1::CONSISTENCY_ASYNC;
  }
};

}  // namespace pserver

#endif  // PSERVER_WORKER_CLIENT_H_
