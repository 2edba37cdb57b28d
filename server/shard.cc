// Shard: the push path of a round (checked, queued, summed in worker order,
// the round completed and the optimizer stepped). The other methods live by
// concept in shard_create.cc (configuration, creation, request checks),
// shard_membership.cc (Register, leases), shard_pulls.cc (pulls, frozen
// variance) and shard_state.cc (status, checkpoints, shutdown).
#include "server/shard.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/unchanged.h"
#include "common/norms.h"
#include "common/tensor_codecs.h"
#include "common/validated_tensor.h"
#include "common/rejection.h"
#include "server/internal/shard_common.h"

namespace pserver {
namespace {

using internal::NotRegistered;
using internal::ShuttingDown;

const char* SpaceName(v1::GradientSpace s) {
  return s == v1::GRADIENT_SPACE_PRECONDITIONED ? "PRECONDITIONED" : "RAW";
}

}  // namespace


absl::StatusOr<v1::PushResponse> Shard::Push(const v1::PushRequest& req) {
  bool queued = false;
  return Push(std::make_shared<v1::PushRequest>(req), nullptr, &queued);
}

absl::StatusOr<v1::PushResponse> Shard::Push(
    std::shared_ptr<v1::PushRequest> request,
    std::function<void()> on_summed, bool* queued) {
  *queued = false;
  const v1::PushRequest& req = *request;
  if (absl::Status s = CheckWorker(req.worker_id()); !s.ok()) return s;
  if (!v1::GradientSpace_IsValid(req.space())) {
    return Reject(v1::REJECT_REASON_INVALID_FIELD,
                  absl::InvalidArgumentError(absl::StrCat(
                      "space is ", static_cast<int>(req.space()),
                      "; expected GRADIENT_SPACE_RAW (1) or "
                      "GRADIENT_SPACE_PRECONDITIONED (2)")));
  }
  const uint32_t c = req.chunk();
  const bool unchanged = HasUnchanged(req.gradient());
  uint64_t n;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ShuttingDown();
    if (!registered_) return NotRegistered();
    if (!worker_registered_[req.worker_id()]) {
      return Reject(v1::REJECT_REASON_NOT_REGISTERED,
                    absl::FailedPreconditionError(absl::StrCat(
                        "worker_id ", req.worker_id(),
                        leases_.left(req.worker_id())
                            ? " left the rounds (Leave); call Register to "
                              "come back"
                            : " has not registered; call Register first")));
    }
    if (absl::Status s = CheckChunk(c); !s.ok()) return s;
    n = round_.plan().size(c);
    if (unchanged) {
      if (absl::Status s = CheckUnchanged(req.gradient(), c); !s.ok()) {
        return s;
      }
    }
    if (!buffers_.empty()) {  // a no-gradient piece over one is refused
      if (absl::Status s = CheckNoGradient(req.gradient(), c); !s.ok()) {
        return s;
      }
    }
  }
  // Payload checks need no state: run them before taking the lock.
  absl::StatusOr<ValidatedTensor> valid = ValidateTensor(req.gradient(), n);
  if (!valid.ok()) {
    // "wrong_size" only when the codec and its parameters were acceptable.
    const bool wrong_size =
        req.gradient().num_elements() != n &&
        MakeCodec(req.gradient().codec(), req.gradient().params()).ok();
    return Reject(wrong_size ? v1::REJECT_REASON_WRONG_SIZE
                             : v1::REJECT_REASON_INVALID_PAYLOAD,
                  absl::InvalidArgumentError(absl::StrCat(
                      "gradient (chunk ", c, "): ", valid.status().message())));
  }

  std::vector<Ready> ready;
  v1::PushResponse resp;
  // What came over the wire (unchanged pieces are filled in below).
  const uint64_t wire_bytes = PayloadBytes(req.gradient());
  {
    absl::MutexLock lock(&mu_);
    const uint32_t w = req.worker_id();
    leases_.Touch(w);
    // Unchanged pieces stand for the replica's values of the push's step,
    // which the shard holds only while it is at that step: filled in now
    // (bsp sums a push of this step only; ssp and async would sum an older
    // one, whose values are gone).
    if (unchanged && policy_.relaxed() && req.step() != step_) {
      return Reject(v1::REJECT_REASON_INVALID_PAYLOAD,
                    absl::InvalidArgumentError(absl::StrCat(
                        "gradient (chunk ", c, "): unchanged pieces in a "
                        "push of step ", req.step(), "; the shard is at step ",
                        step_, " (under ssp and async only a push of the "
                        "shard's step may leave its buffers out)")));
    }
    if (unchanged && req.step() == step_) {
      if (absl::Status s = FillUnchanged(request.get(), &*valid); !s.ok()) {
        return s;
      }
    }
    absl::Status st =
        policy_.relaxed()
            ? PushRelaxed(request, *valid, wire_bytes, on_summed, queued, &resp)
            : PushSynchronous(request, *valid, wire_bytes, on_summed, queued,
                              &resp);
    if (!st.ok()) return st;
    if (*queued) ready = Drain();
    resp.set_current_step(step_);
  }
  for (Ready& r : ready) r();
  return resp;
}

absl::Status Shard::CheckForm(const v1::PushRequest& req) const {
  const v1::GradientSpace space = req.space() == v1::GRADIENT_SPACE_UNSPECIFIED
                                      ? v1::GRADIENT_SPACE_RAW
                                      : req.space();
  if (space != optimizer_->expected_space()) {
    return Reject(v1::REJECT_REASON_WRONG_SPACE,
                  absl::FailedPreconditionError(absl::StrCat(
                      "space is ", SpaceName(space), "; expected ",
                      SpaceName(optimizer_->expected_space()), " at step ",
                      step_)));
  }
  if (const bool want = ExpectsMomentum(); req.momentum() != want) {
    return Reject(v1::REJECT_REASON_WRONG_SPACE,
                  absl::FailedPreconditionError(absl::StrCat(
                      "momentum is ", req.momentum() ? "true" : "false",
                      "; expected ", want ? "true" : "false", " at step ",
                      step_, " (the shard's --onebit_momentum=",
                      config_.optimizer.worker_momentum ? "worker" : "server",
                      ")")));
  }
  if (absl::Status s = RoundHyper::Validate(req, GroupCount(layout_));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckClip(req); !s.ok()) return s;
  return hyper_.Check(req, /*strict=*/!policy_.relaxed());
}

absl::Status Shard::RefusePiece(uint32_t c, const OutsidePiece& piece,
                                const char* what, const char* kind,
                                const char* over) const {
  const uint64_t at = range_.begin + piece.element;
  std::string tensor = "?";
  for (const TensorSlot& slot : slots_) {
    if (slot.offset <= at && at < slot.offset + slot.size) tensor = slot.name;
  }
  return Reject(
      v1::REJECT_REASON_INVALID_PAYLOAD,
      absl::InvalidArgumentError(absl::StrCat(
          "gradient (chunk ", c, "): ",
          piece.segment >= 0 ? absl::StrCat("segments[", piece.segment, "]")
                             : std::string("the tensor"),
          " is ", what, " over element ", at, " of tensor '", tensor, "', ",
          kind, "; expected ", what, " only over ", over, " tensors")));
}

absl::Status Shard::CheckUnchanged(const v1::EncodedTensor& t,
                                   uint32_t c) const {
  const std::optional<OutsidePiece> out =
      UnchangedOutside(t, round_.plan().begin(c), buffers_);
  if (!out.has_value()) return absl::OkStatus();
  return RefusePiece(c, *out, "unchanged", "a parameter", "buffer");
}

absl::Status Shard::CheckNoGradient(const v1::EncodedTensor& t,
                                    uint32_t c) const {
  const std::optional<OutsidePiece> over =
      NoGradientOver(t, round_.plan().begin(c), buffers_);
  if (!over.has_value()) return absl::OkStatus();
  return RefusePiece(c, *over, "no_gradient", "a buffer", "parameter");
}

absl::Status Shard::FillUnchanged(v1::PushRequest* req,
                                  ValidatedTensor* valid) {
  const uint32_t c = req->chunk();
  const uint64_t n = round_.plan().size(c);
  pserver::FillUnchanged(
      req->mutable_gradient(),
      replica_->x_hat().subspan(round_.plan().begin(c), n));
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(req->gradient(), n);
  if (!v.ok()) {
    return Reject(v1::REJECT_REASON_INVALID_PAYLOAD,
                  absl::FailedPreconditionError(absl::StrCat(
                      "gradient (chunk ", c, "): the shard's own values of "
                      "its unchanged pieces do not pass: ",
                      v.status().message(), "; push the values instead")));
  }
  *valid = *v;
  return absl::OkStatus();
}

absl::Status Shard::PushSynchronous(
    std::shared_ptr<v1::PushRequest>& request, const ValidatedTensor& valid,
    uint64_t wire_bytes, std::function<void()>& on_summed, bool* queued,
    v1::PushResponse* resp) {
  const v1::PushRequest& req = *request;
  const uint32_t w = req.worker_id();
  const uint32_t c = req.chunk();
  if (req.step() == step_ && !leases_.live(w) && !round_.queued(w, c)) {
    return DroppedWorker(w);
  }
  if (req.step() < step_ && req.step() >= lost_from_ &&
      req.step() < lost_to_ &&
      last_pushed_[w] < static_cast<int64_t>(req.step())) {
    // That round was lost in a restart and skipped; the current weights
    // stand for its result, so the worker only has to pull them.
    resp->set_round_lost(true);
  } else if (req.step() < step_) {
    if (last_pushed_[w] < static_cast<int64_t>(req.step())) {
      return Reject(v1::REJECT_REASON_STALE_STEP,
                    absl::AbortedError(absl::StrCat(
                        "step is ", req.step(), "; the shard is at step ",
                        step_, " and worker ", w, " never pushed that step")));
    }
    resp->set_duplicate(true);
  } else if (req.step() > step_) {
    return Reject(v1::REJECT_REASON_FUTURE_STEP,
                  absl::FailedPreconditionError(absl::StrCat(
                      "step is ", req.step(), "; the shard is at step ", step_,
                      " (pull step ", step_, " first)")));
  } else if (round_.pushed(w, c)) {
    resp->set_duplicate(true);
  } else if (absl::Status form = CheckForm(req); !form.ok()) {
    return form;
  } else {
    if (round_.received() == 0) {
      round_start_ = clock_->Now();
      round_clip_ = req.clip_norm();
    }
    metrics_->AddReceived(req.gradient().codec(), wire_bytes,
                          Fp32Bytes(req.gradient().num_elements()));
    if (!round_.pushed_any(w)) metrics_->ObserveStaleness(0);
    hyper_.Record(req);
    Round::Push push =
        Round::Push::Own(std::move(request), valid, std::move(on_summed));
    push.overflow = req.overflow();
    round_.Queue(w, std::move(push), c);
    diagnostics_.Arrived(w, clock_->Now());
    *queued = true;
    last_pushed_[w] = static_cast<int64_t>(req.step());
  }
  return absl::OkStatus();
}

bool Shard::WaitsFor(uint32_t w) const {
  WorkerView view;
  view.live = leases_.live(w);
  view.in_round = round_.pushed_any(w);
  view.version = CurrentVersion(w);
  view.late = late_[w];
  return policy_.WaitsFor(view, step_, patience_over_, released_);
}

std::vector<Shard::Ready> Shard::Drain() {
  // Called by round_ inside BeginSum, i.e. with mu_ held.
  auto waits_for = [this](uint32_t w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return WaitsFor(w);
  };
  std::vector<Ready> ready;  // acknowledgements of the chunks summed
  while (true) {
    while (std::optional<Round::Batch> batch = round_.BeginSum(waits_for)) {
      // This thread holds the batch's chunk until EndSum (BeginSum hands
      // each chunk to one thread at a time) and its push stays queued until
      // then: decode into the thread-safe sum without mu_ so other pushes
      // are validated, queued and summed (other chunks) meanwhile.
      RoundSum* const sum = round_.sum();
      const uint64_t elements = batch->a->valid->num_elements();
      mu_.Unlock();
      const absl::Time start = clock_->Now();
      sum->Add(*batch);
      metrics_->ObserveAggregation(
          absl::ToDoubleSeconds(clock_->Now() - start));
      metrics_->AddDecodedElements(elements);
      mu_.Lock();
      presence_.Mark(round_.plan().begin(batch->chunk),
                     batch->a->valid->tensor());
      if (batch->a->overflow) presence_.MarkOverflow(batch->first);
      if (std::function<void()> done = round_.EndSum(*batch)) {
        ready.push_back(std::move(done));
      }
    }
    if (!round_.all_in() || round_.summing()) return ready;
    if (round_.contributors() == 0) {
      round_.Restart();  // every worker was passed over: wait for pushes
      return ready;
    }
    if (HoldForClip(&ready)) return ready;  // until a pull brings the norm
    std::vector<Ready> more = CompleteRound();
    for (Ready& r : more) ready.push_back(std::move(r));
    // Pushes deferred to the new round (ssp, async) may complete it too.
    if (round_.received() == 0) return ready;
  }
}

std::vector<Shard::Ready> Shard::CompleteRound(std::optional<double> total) {
  double update_norm = 0, residual_norm = 0;
  // The norms' gauges need passes over the slice: refreshed at most every
  // kNormsPeriod (they are scraped every few seconds), not every round.
  const bool norms = clock_->Now() - norms_at_ >= kNormsPeriod;
  double optimizer_seconds = 0;
  absl::Time pull_start;
  // WithMean runs the lambda synchronously, under mu_ still.
  const v1::OptimizerStage stage_before = optimizer_->stage();
  if (policy_.has_patience()) {
    deadlines_.emplace_back(step_, deadline_);
    if (deadlines_.size() > kDeadlinesKept) deadlines_.pop_front();
    round_durations_.push_back(clock_->Now() - round_open_);
    if (round_durations_.size() > kDurationsKept) round_durations_.pop_front();
  }
  if (policy_.has_patience() && (patience_over_ || released_)) {
    // The cohort workers this round stopped waiting for are late now.
    for (uint32_t w = 0; w < late_.size(); ++w) {
      if (leases_.live(w) && !round_.pushed_any(w) &&
          CurrentVersion(w) >= step_) {
        late_[w] = true;
      }
    }
  }
  round_.WithMean([&](absl::Span<float> mean) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Broadcast buffers hold worker 0's values (the sum: the others pushed
    // zeros), or, in a round without worker 0, stay as they were.
    if (!broadcast_.empty() &&
        !(round_.pushed_any(0) && !round_.passed_over(0))) {
      for (const auto& [b, e] : broadcast_) {
        std::copy(x_.begin() + b, x_.begin() + e, mean.begin() + b);
      }
    }
    if (total.has_value()) ClipMean(mean, *total);
    round_clip_ = 0.0f;
    clip_held_ = false;
    const std::vector<GroupHyper> hyper =
        hyper_.For(step_, config_.optimizer, layout_);
    PublishLearningRates(hyper);
    optimizer_->SetHyper(hyper);
    if (std::vector<bool> skip = presence_.Skipped(); !skip.empty()) {
      optimizer_->SkipNext(std::move(skip));
    }
    if (presence_.overflow()) {  // said with the next step's pulls
      replica_->MarkRoundSkipped(step_ + 1);
      metrics_->CountDiagnostic("overflow_skip");
      std::fprintf(stderr, "pserver: shard %u skipped round %llu: worker %u "
                   "reported an overflow (its loss scaler found inf/NaN)\n",
                   config_.shard_index, static_cast<unsigned long long>(step_),
                   presence_.overflow_worker());
    }
    presence_.Clear();
    const absl::Time start = clock_->Now();
    update_norm = optimizer_->Step(mean, absl::MakeSpan(x_));
    optimizer_seconds = absl::ToDoubleSeconds(clock_->Now() - start);
    ++step_;
    // Downlink: the replica follows x through the pull codec (the round's
    // phase's, with a schedule); the mean is free now and serves as scratch
    // for x - x_hat.
    pull_start = clock_->Now();
    if (schedule_.has_value()) {
      const size_t phase = schedule_->PhaseAt(step_ - 1);
      const CompressionSchedule& schedule = schedule_->schedule();
      const CodecChoiceSpec* pull = schedule.pull(phase);
      replica_->UseCodec(pull != nullptr ? pull->encoder.get() : nullptr);
      if (schedule.has_tensor_pulls() &&
          pull_plan_phase_ != static_cast<int64_t>(phase)) {
        replica_->UseTensorCodecs(CodecPlan::ForSlice(
            slots_, range_,
            WithExactBuffers(slots_,
                             schedule.TensorPullCodecs(phase, slots_))));
        pull_plan_phase_ = static_cast<int64_t>(phase);
      }
    }
    if (norms) {
      residual_norm = replica_->Advance(x_, step_, mean);
    } else {
      replica_->AdvanceQuietly(x_, step_, mean);
    }
  }, broadcast_);
  if (!policy_.relaxed()) hyper_.Clear();
  ++arrays_version_;
  catching_up_ = false;
  metrics_->AddAppliedPushes(round_.contributors());
  metrics_->ObserveOptimizer(optimizer_seconds);
  metrics_->ObservePullEncode(absl::ToDoubleSeconds(clock_->Now() - pull_start));
  metrics_->ObserveRound(absl::ToDoubleSeconds(clock_->Now() - round_start_));
  {
    // The round just completed is step_ - 1: a regime change when the
    // optimizer froze in it or it began a schedule phase.
    const uint64_t round = step_ - 1;
    const bool change = optimizer_->stage() != stage_before ||
                        (round > 0 && PhaseAt(round) != PhaseAt(round - 1));
    RoundDiagnostics::RoundEnd end = diagnostics_.EndRound(
        round, round_start_, clock_->Now(), update_norm, change);
    metrics_->ObserveStragglers(end.wait_seconds, end.top_worker,
                                end.top_share, end.wait_share);
    for (const RoundFinding& f : end.findings) {
      metrics_->CountDiagnostic(RoundFindingName(f.kind));
      std::fprintf(stderr, "pserver: shard %u %s\n", config_.shard_index,
                   f.message.c_str());
    }
  }
  metrics_->SetStep(step_);
  metrics_->SetStage(optimizer_->stage());
  metrics_->SetSchedulePhase(PhaseAt(step_));
  if (norms) {
    norms_at_ = clock_->Now();
    metrics_->SetNorms(update_norm,
                       std::sqrt(SquaredNorm(optimizer_->m(), pool_)),
                       residual_norm);
  }

  std::vector<Ready> ready = round_.Clear();  // none: every chunk was summed
  OpenRound();
  if (writer_ != nullptr && config_.checkpoint_every > 0 &&
      step_ % config_.checkpoint_every == 0) {
    writer_->Submit(CaptureState());
  }
  if (leases_.PromoteRejoined()) PublishLiveness();
  for (Ready& r : WakeWaiters()) ready.push_back(std::move(r));
  return ready;
}

}  // namespace pserver
