// Shard: what it holds. Status and state checksums, checkpoint capture and
// restore, shutdown.
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "server/internal/shard_common.h"
#include "server/shard.h"

namespace pserver {

using internal::ShuttingDown;

v1::GetStatusResponse Shard::Status() {
  absl::MutexLock lock(&mu_);
  // Under the same lock as the other fields: all from one round.
  const uint64_t checksum = StateChecksumLocked();
  v1::GetStatusResponse r;
  r.set_shard_index(config_.shard_index);
  r.set_num_shards(config_.num_shards);
  r.set_expected_workers(config_.num_workers);
  r.set_model_registered(registered_);
  r.set_current_step(step_);
  r.set_optimizer(OptimizerName(config_.optimizer.kind));
  r.set_workers_registered(RegisteredCount());
  r.set_pushes_pending(round_.workers_in());
  r.set_workers_live(leases_.live_count());
  r.set_initial_workers(config_.initial_workers != 0 ? config_.initial_workers
                                                     : config_.num_workers);
  r.set_workers_joined(leases_.joined());
  r.set_workers_left(leases_.left_count());
  r.set_rounds_since_start(!catching_up_);
  r.set_skipped_since_start(lost_to_ != 0);  // FastForward moves it past 0
  r.set_takes_state(TakesStateLocked());
  if (registered_) {
    r.set_stage(optimizer_->stage());
    r.set_shard_begin(range_.begin);
    r.set_shard_end(range_.end);
    r.set_replica_checksum(replica_->checksum());
  }
  r.set_state_checksum(checksum);
  return r;
}

bool Shard::registered() {
  absl::MutexLock lock(&mu_);
  return registered_;
}

uint64_t Shard::StateChecksum() {
  absl::MutexLock lock(&mu_);
  return StateChecksumLocked();
}

uint64_t Shard::status_hashes() {
  absl::MutexLock lock(&mu_);
  return status_hashes_;
}

uint64_t Shard::StateChecksumLocked() {
  // The big arrays change only when a round completes or a model is
  // installed, restored or fast-forwarded: hash them once per change, so a
  // caller polling Status() costs the rounds one hash per round at most.
  if (hashed_version_ != arrays_version_) {
    Checksum64 h;
    h.Update(x_.data(), x_.size() * sizeof(float));
    absl::Span<const float> x_hat = replica_->x_hat();
    h.Update(x_hat.data(), x_hat.size() * sizeof(float));
    if (optimizer_) {
      h.Update(optimizer_->m().data(), optimizer_->m().size() * sizeof(float));
      h.Update(optimizer_->v().data(), optimizer_->v().size() * sizeof(float));
    }
    arrays_hash_ = h.Finish();
    hashed_version_ = arrays_version_;
    ++status_hashes_;
  }
  Checksum64 h;
  h.Update(&step_, sizeof(step_));
  h.Update(&arrays_hash_, sizeof(arrays_hash_));
  h.Update(last_pushed_.data(), last_pushed_.size() * sizeof(int64_t));
  for (uint32_t w = 0; w < config_.num_workers; ++w) {
    const bool p = round_.queued_any(w);
    h.Update(&p, 1);
  }
  if (policy_.relaxed()) {
    // ssp and async's bookkeeping (bsp never reads it).
    h.Update(landed_.data(), landed_.size() * sizeof(int64_t));
    h.Update(version_.data(), version_.size() * sizeof(uint64_t));
    for (uint32_t w = 0; w < config_.num_workers; ++w) {
      const bool f = late_[w];
      h.Update(&f, 1);
      const uint64_t d = deferred_[w].size();
      h.Update(&d, sizeof(d));
    }
  }
  return h.Finish();
}

void Shard::Shutdown() {
  std::vector<PullWaiters::Waiter> waiters;
  std::vector<Ready> dropped;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    reaper_stop_ = true;
    timer_stop_ = true;
    waiters = waiters_.TakeAll();
    // Queued chunks are acknowledged (their calls end); a checkpoint taken
    // after this holds the completed rounds only.
    if (!round_.summing()) dropped = ClearRound();
  }
  for (Ready& r : dropped) r();
  if (reaper_) {
    reaper_->join();
    reaper_.reset();
  }
  if (timer_) {
    timer_->join();
    timer_.reset();
  }
  for (PullWaiters::Waiter& w : waiters) w.done(ShuttingDown(), nullptr);
}

ShardState Shard::CaptureState() {
  ShardState st;
  st.shard_index = config_.shard_index;
  st.num_shards = config_.num_shards;
  st.num_workers = config_.num_workers;
  st.optimizer_kind = static_cast<uint32_t>(config_.optimizer.kind);
  st.frozen = optimizer_->frozen();
  st.preconditioned = config_.optimizer.preconditioned;
  st.worker_momentum = config_.optimizer.worker_momentum;
  st.step = step_;
  st.freeze_step = optimizer_->freeze_at();
  st.prev_replica_checksum = replica_->prev_checksum();
  st.replica_checksum = replica_->checksum();
  st.layout = layout_;
  st.delta = replica_->delta();
  st.x = x_;
  st.m.assign(optimizer_->m().begin(), optimizer_->m().end());
  st.v.assign(optimizer_->v().begin(), optimizer_->v().end());
  st.x_hat.assign(replica_->x_hat().begin(), replica_->x_hat().end());
  st.last_pushed = last_pushed_;
  st.idle_rounds.assign(optimizer_->idle_rounds().begin(),
                        optimizer_->idle_rounds().end());
  st.local_steps = local_steps_;
  st.has_adam_hyper = true;
  st.beta1 = opt_.beta1;
  st.beta2 = opt_.beta2;
  st.eps = opt_.eps;
  if (schedule_.has_value()) {
    st.schedule_fingerprint = schedule_->schedule().fingerprint();
    st.schedule_total_steps = schedule_->total_steps();
  }
  return st;
}

absl::Status Shard::RestoreFrom(ShardState st) {
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(st.layout);
  if (!slots.ok()) return slots.status();
  // The loader compared the fingerprints; the run length resolves it again.
  absl::StatusOr<std::optional<ResolvedSchedule>> schedule =
      ResolveSchedule(st.schedule_total_steps);
  if (!schedule.ok()) return schedule.status();
  if (config_.local_steps != 0 && st.local_steps != config_.local_steps) {
    // Every worker would be refused by one of the two values.
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint local_steps is ", st.local_steps, "; expected ",
        config_.local_steps, " (this shard's --local_steps)"));
  }
  // The loader refused a file whose x_hat does not match its checksum
  // (server/checkpoint.cc), falling back to an older one.
  absl::MutexLock lock(&mu_);
  CommitState(std::move(st), *slots, *std::move(schedule));
  return absl::OkStatus();
}

void Shard::CommitState(ShardState st, const std::vector<TensorSlot>& slots,
                        std::optional<ResolvedSchedule> schedule) {
  if (st.has_adam_hyper) {
    // What its moments were computed with (a flag that disagrees was
    // refused by the loader: CheckpointExpectation).
    opt_.beta1 = st.beta1;
    opt_.beta2 = st.beta2;
    opt_.eps = st.eps;
  }
  InstallModel(st.layout, slots, std::move(st.x));
  replica_->Restore(std::move(st.x_hat), std::move(st.delta),
                    st.replica_checksum, st.prev_replica_checksum);
  optimizer_->RestoreState(st.step, st.frozen, std::move(st.m),
                           std::move(st.v), st.freeze_step);
  // The loader checked the count and the values (server/checkpoint.cc).
  absl::Status idle = optimizer_->RestoreIdleRounds(
      std::vector<uint64_t>(st.idle_rounds.begin(), st.idle_rounds.end()));
  ABSL_RAW_CHECK(idle.ok(), "CommitState: idle rounds not checked");
  step_ = st.step;
  last_pushed_ = std::move(st.last_pushed);
  std::fill(version_.begin(), version_.end(), step_);
  std::fill(landed_.begin(), landed_.end(), -1);
  std::fill(late_.begin(), late_.end(), false);
  round_open_ = clock_->Now();
  local_steps_ = st.local_steps;
  schedule_ = std::move(schedule);
  ++arrays_version_;
  // Workers registered before the restart may push straight away.
  worker_registered_.assign(config_.num_workers, true);
  metrics_->SetStep(step_);
  metrics_->SetStage(optimizer_->stage());
  metrics_->SetSchedulePhase(PhaseAt(step_));
  metrics_->SetWorkersRegistered(config_.num_workers);
  PublishLearningRates(RoundHyper().For(step_, config_.optimizer, layout_));
}

absl::Status Shard::SaveCheckpoint() {
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError("no checkpoint_dir is configured");
  }
  ShardState state;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) {
      return absl::FailedPreconditionError(
          "no model is registered; nothing to checkpoint");
    }
    state = CaptureState();
  }
  return writer_->WriteNow(state);
}

absl::Status Shard::Close() {
  if (writer_ == nullptr) return absl::OkStatus();
  writer_->Stop();
  if (!registered()) return absl::OkStatus();
  return SaveCheckpoint();
}

Shard::~Shard() {
  {
    absl::MutexLock lock(&mu_);
    reaper_stop_ = true;
    timer_stop_ = true;
  }
  if (reaper_) reaper_->join();
  if (timer_) timer_->join();
  if (writer_) writer_->Stop();
}

}  // namespace pserver
