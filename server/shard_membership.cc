// Shard: who takes part. Register (the first registration installs the
// model, through shard_install.cc; a re-registration may fast-forward a
// shard that lost rounds; a worker in a slot beyond the initial ones joins
// the running job). Leases and Leave: shard_leases.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/codec.h"
#include "common/rejection.h"
#include "common/validated_tensor.h"
#include "server/internal/shard_common.h"
#include "common/tensor_codecs.h"
#include "server/shard.h"

namespace pserver {

using internal::ShuttingDown;

uint32_t Shard::RegisteredCount() const {
  uint32_t count = 0;
  for (bool b : worker_registered_) count += b ? 1 : 0;
  return count;
}

absl::Status Shard::CheckRegisterRequest(const v1::RegisterRequest& req,
                                         std::vector<TensorSlot>* slots) const {
  if (absl::Status s = CheckWorker(req.worker_id()); !s.ok()) return s;
  if (req.num_workers() != config_.num_workers) {
    return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                  absl::FailedPreconditionError(absl::StrCat(
                      "num_workers is ", req.num_workers(),
                      "; the shard expects ", config_.num_workers)));
  }
  if (req.num_shards() != config_.num_shards ||
      req.shard_index() != config_.shard_index) {
    return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                  absl::FailedPreconditionError(absl::StrCat(
                      "shard_index/num_shards is ", req.shard_index(), "/",
                      req.num_shards(), "; this shard is ", config_.shard_index,
                      "/", config_.num_shards)));
  }
  if (config_.push_codec != v1::CODEC_UNSPECIFIED &&
      req.push_codec() != v1::CODEC_UNSPECIFIED &&
      req.push_codec() != config_.push_codec) {
    return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                  absl::FailedPreconditionError(absl::StrCat(
                      "push_codec is ", CodecName(req.push_codec()),
                      "; this job pushes ", CodecName(config_.push_codec),
                      " (", JobPushCodecSource(config_), " on the shards): "
                      "expected the worker to leave push_codec unset (it "
                      "takes the job's) or the shards to be started with "
                      "another --push_codec")));
  }
  absl::StatusOr<std::vector<TensorSlot>> s = ValidateLayout(req.layout());
  if (!s.ok()) return Reject(v1::REJECT_REASON_BAD_LAYOUT, s.status());
  for (size_t i = 0; i < s->size(); ++i) {
    const TensorSlot& t = (*s)[i];
    // Worker 0's values need worker 0 in every round; a stale push's
    // weight would scale a buffer's values, not only its say in the mean.
    const char* why =
        t.broadcast && policy_.relaxed()
            ? "a broadcast buffer; the shard's --consistency is not bsp: "
              "expected --consistency=bsp, or an averaged buffer"
        : t.buffer && policy_.config().scale_by_staleness
            ? "a buffer; the shard's --staleness_scaling=inverse would "
              "shrink it: expected parameters only, or "
              "--staleness_scaling=none"
            : nullptr;
    if (why != nullptr) {
      return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                    absl::FailedPreconditionError(absl::StrCat(
                        "layout.tensors[", i, "] ('", t.name, "') is ",
                        why)));
    }
  }
  *slots = *std::move(s);
  if (req.local_steps() > kMaxJobLocalSteps) {
    return Reject(v1::REJECT_REASON_INVALID_FIELD,
                  absl::InvalidArgumentError(absl::StrCat(
                      "local_steps is ", req.local_steps(), "; expected 0..",
                      kMaxJobLocalSteps)));
  }
  const uint64_t fingerprint =
      config_.schedule != nullptr ? config_.schedule->fingerprint() : 0;
  if (req.schedule_fingerprint() != fingerprint) {
    return Reject(
        v1::REJECT_REASON_CONFIG_MISMATCH,
        absl::FailedPreconditionError(absl::StrFormat(
            "schedule_fingerprint is %016x; this shard's compression schedule "
            "is %016x (0: none; the workers and shards need the same "
            "--schedule file)",
            req.schedule_fingerprint(), fingerprint)));
  }
  if (absl::Status s = ResolveSchedule(req.total_steps()).status(); !s.ok()) {
    return s;
  }
  if (config_.schedule != nullptr) {
    if (absl::Status s = config_.schedule->CheckTensors(*slots); !s.ok()) {
      return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                    absl::FailedPreconditionError(
                        absl::StrCat("--schedule: ", s.message())));
    }
  }
  if (req.resume_step() >= kMaxResumeStep) {
    return Reject(v1::REJECT_REASON_BAD_RESUME_STEP,
                  absl::InvalidArgumentError(absl::StrCat(
                      "resume_step is ", req.resume_step(), "; expected < 2^62")));
  }
  // Limits on the model, before anything is allocated for it.
  const uint64_t total = TotalElements(req.layout());
  if (total > config_.max_model_elements) {
    return Reject(v1::REJECT_REASON_MODEL_TOO_LARGE,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "layout holds ", total, " elements; this shard accepts "
                      "at most ", config_.max_model_elements,
                      " (--max_model_elements)")));
  }
  const uint64_t slice =
      ShardRangeFor(total, config_.num_shards, config_.shard_index).size();
  // Pulls are answered chunk by chunk: the largest answer is one chunk's
  // fp32 snapshot, whatever the model size.
  const uint64_t chunk = std::min(slice, config_.chunk_elements);
  const uint64_t snapshot_bytes =
      Fp32Bytes(chunk) + kPullResponseOverheadBytes;
  if (config_.max_response_bytes > 0 &&
      snapshot_bytes > config_.max_response_bytes) {
    return Reject(v1::REJECT_REASON_MODEL_TOO_LARGE,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "this shard's chunks of ", chunk, " elements need ",
                      snapshot_bytes, "-byte snapshots; the message limit is ",
                      config_.max_response_bytes,
                      " bytes (--max_message_mb); lower --chunk_elements")));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterResponse> Shard::Register(
    const v1::RegisterRequest& req) {
  std::vector<TensorSlot> slots;
  if (absl::Status s = CheckRegisterRequest(req, &slots); !s.ok()) return s;

  // Pulls that a fast-forward makes answerable are answered after unlocking.
  std::vector<Ready> ready;
  absl::StatusOr<v1::RegisterResponse> result =
      [&]() -> absl::StatusOr<v1::RegisterResponse> {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ShuttingDown();
    const uint32_t w = req.worker_id();
    if (req.resume_step() > step_ + 1 && !catching_up_) {
      // A shard that completed a round in this incarnation lost none: its
      // workers are at most one step ahead (a push that reached only some
      // shards).
      return Reject(v1::REJECT_REASON_BAD_RESUME_STEP,
                    absl::InvalidArgumentError(absl::StrCat(
                        "resume_step is ", req.resume_step(),
                        "; this shard is at step ", step_,
                        " and has lost no rounds, so expected at most ",
                        step_ + 1)));
    }
    if (req.resume_step() > step_ && round_.summing()) {
      return Reject(v1::REJECT_REASON_BUSY,
                    absl::UnavailableError(absl::StrCat(
                        "resume_step is ", req.resume_step(), " while step ",
                        step_, " is being summed; retry")));
    }
    v1::RegisterResponse resp;
    const uint32_t local_steps = std::max<uint32_t>(1, req.local_steps());
    if (config_.local_steps != 0 && local_steps != config_.local_steps) {
      return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                    absl::FailedPreconditionError(absl::StrCat(
                        "local_steps is ", local_steps, "; expected ",
                        config_.local_steps, " (this shard's --local_steps)")));
    }
    if (absl::Status s = AdoptAdamHyper(req); !s.ok()) return s;
    if (registered_) {
      std::string diff = FirstLayoutDifference(req.layout(), layout_);
      if (!diff.empty()) {
        return Reject(v1::REJECT_REASON_LAYOUT_MISMATCH,
                      absl::FailedPreconditionError(absl::StrCat(
                          "model layout differs from the registered one: ",
                          diff)));
      }
      if (local_steps != local_steps_) {
        return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                      absl::FailedPreconditionError(absl::StrCat(
                          "local_steps is ", local_steps, "; the job pushes "
                          "every ", local_steps_, " local steps")));
      }
      if (schedule_.has_value() && schedule_->schedule().uses_fractions() &&
          req.total_steps() != schedule_->total_steps()) {
        return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                      absl::FailedPreconditionError(absl::StrCat(
                          "total_steps is ", req.total_steps(),
                          "; the job runs ", schedule_->total_steps(),
                          " rounds (the schedule's fractions are of that)")));
      }
    } else if (req.chunked_weights()) {
      absl::StatusOr<bool> complete = InstallChunk(req, std::move(slots));
      if (!complete.ok()) return complete.status();
      if (!*complete) {
        // More chunks to come: the worker joins once the model is in.
        const ShardRange range =
            ShardRangeFor(TotalElements(req.layout()), config_.num_shards,
                          config_.shard_index);
        resp.set_shard_begin(range.begin);
        resp.set_shard_end(range.end);
        resp.set_current_step(step_);
        resp.set_chunk_elements(config_.chunk_elements);
        resp.set_model_ready(false);
        return resp;
      }
      local_steps_ = local_steps;
      schedule_ = *ResolveSchedule(req.total_steps());  // checked above
      resp.set_initialized_model(true);
    } else {
      const uint64_t n = ShardRangeFor(TotalElements(req.layout()),
                                       config_.num_shards, config_.shard_index)
                             .size();
      // The contract's dense codec, exactly the slice's size: nothing is
      // allocated for a model the request does not actually carry.
      const v1::EncodedTensor& init = req.initial_weights();
      if (init.codec() != v1::CODEC_FP32) {
        return Reject(v1::REJECT_REASON_INVALID_PAYLOAD,
                      absl::InvalidArgumentError(absl::StrCat(
                          "initial_weights.codec is ", CodecName(init.codec()),
                          "; expected fp32 (CODEC_FP32)")));
      }
      if (init.num_elements() != n || init.payload().size() != Fp32Bytes(n)) {
        return Reject(v1::REJECT_REASON_WRONG_SIZE,
                      absl::InvalidArgumentError(absl::StrCat(
                          "initial_weights holds ", init.num_elements(),
                          " elements in ", init.payload().size(),
                          " bytes; expected ", n, " elements in ",
                          Fp32Bytes(n), " bytes (this shard's slice)")));
      }
      absl::StatusOr<ValidatedTensor> valid = ValidateTensor(init, n);
      if (!valid.ok()) {
        return Reject(v1::REJECT_REASON_INVALID_PAYLOAD,
                      absl::InvalidArgumentError(absl::StrCat(
                          "initial_weights: ", valid.status().message())));
      }
      std::vector<float> x(n);
      valid->DecodeInto(absl::MakeSpan(x));
      InstallModel(req.layout(), slots, std::move(x));
      local_steps_ = local_steps;
      schedule_ = *ResolveSchedule(req.total_steps());  // checked above
      resp.set_initialized_model(true);
    }
    if (req.resume_step() > step_) {
      if (round_.started()) {
        // A worker at resume_step proves round step_ completed before this
        // shard lost it: the pushes queued for it are dropped with it.
        std::fprintf(stderr,
                     "pserver: shard %u drops %u pushes queued for step %lu\n",
                     config_.shard_index, round_.received(),
                     static_cast<unsigned long>(step_));
        ready = ClearRound();
      }
      FastForward(req.resume_step());
      for (Ready& r : WakeWaiters()) ready.push_back(std::move(r));
    }
    worker_registered_[w] = true;
    // It takes the current weights: its next push is computed on them.
    version_[w] = step_;
    late_[w] = false;
    leases_.Touch(w);
    if (!leases_.live(w)) {
      const bool joins = leases_.absent(w);
      const bool now = leases_.Rejoin(w, round_.started());
      std::fprintf(stderr, "pserver: shard %u: worker %u %s at step %lu\n",
                   config_.shard_index, w, joins ? "joins" : "rejoins",
                   static_cast<unsigned long>(step_ + (now ? 0 : 1)));
      if (joins) metrics_->AddJoinedWorker();
      PublishLiveness();
    }
    metrics_->SetWorkersRegistered(RegisteredCount());
    resp.set_shard_begin(range_.begin);
    resp.set_shard_end(range_.end);
    resp.set_current_step(step_);
    resp.set_stage(optimizer_->stage());
    resp.set_freeze_step(optimizer_->freeze_at());
    resp.set_compression_space(config_.optimizer.preconditioned
                                   ? v1::GRADIENT_SPACE_PRECONDITIONED
                                   : v1::GRADIENT_SPACE_RAW);
    resp.set_chunk_elements(config_.chunk_elements);
    resp.set_worker_momentum(WorkerMomentumBeta(opt_));
    resp.set_schedule_phase(PhaseAt(step_));
    resp.set_consistency(static_cast<v1::Consistency>(
        static_cast<int>(policy_.mode()) + 1));
    resp.set_max_staleness(policy_.config().max_staleness);
    {
      const OptimizerConfig& o = opt_;
      v1::OptimizerSettings* set = resp.mutable_optimizer_settings();
      set->set_optimizer(OptimizerName(o.kind));
      set->set_lr(o.lr);
      set->set_beta1(o.beta1);
      set->set_beta2(o.beta2);
      set->set_eps(o.eps);
      set->set_weight_decay(o.weight_decay);
      set->set_momentum(o.momentum);
      set->set_nesterov(o.nesterov);
      set->set_bias_correction(o.bias_correction);
    }
    resp.set_push_codec(JobPushCodec(config_));
    resp.set_push_codec_source(JobPushCodecSource(config_));
    resp.set_model_ready(true);
    return resp;
  }();
  for (Ready& r : ready) r();
  return result;
}

void Shard::FastForward(uint64_t step) {
  const uint64_t skipped = step - step_;
  std::fprintf(stderr,
               "pserver: shard %u skips from step %lu to %lu (a worker "
               "resumed there; %lu rounds of this shard are lost)\n",
               config_.shard_index, static_cast<unsigned long>(step_),
               static_cast<unsigned long>(step),
               static_cast<unsigned long>(skipped));
  // Consecutive fast-forwards (no round completed between them) extend one
  // lost range.
  if (lost_to_ != step_) lost_from_ = step_;
  lost_to_ = step;
  step_ = step;
  // Every worker resumes from the current weights.
  std::fill(version_.begin(), version_.end(), step_);
  std::fill(landed_.begin(), landed_.end(), -1);
  std::fill(late_.begin(), late_.end(), false);
  OpenRound();
  optimizer_->FastForward(step);
  // Workers' replicas of this shard are not x_hat any more: snapshots only.
  replica_->Invalidate();
  ++arrays_version_;
  metrics_->AddSkippedRounds(skipped);
  metrics_->SetStep(step_);
  metrics_->SetStage(optimizer_->stage());
}

absl::Status Shard::AdoptAdamHyper(const v1::RegisterRequest& req) {
  if (config_.optimizer.kind == OptimizerKind::kSgd) return absl::OkStatus();
  const v1::AdamHyper& h = req.adam_hyper();
  struct Field {
    const char* name;
    bool has;
    float value;
    float* mine;
    bool given;
  } fields[] = {
      {"beta1", h.has_beta1(), h.beta1(), &opt_.beta1, config_.beta1_given},
      {"beta2", h.has_beta2(), h.beta2(), &opt_.beta2, config_.beta2_given},
      {"eps", h.has_eps(), h.eps(), &opt_.eps, config_.eps_given},
  };
  for (const Field& f : fields) {
    if (!f.has || f.value == *f.mine) continue;
    if (f.given || registered_) {
      return Reject(v1::REJECT_REASON_CONFIG_MISMATCH,
                    absl::FailedPreconditionError(absl::StrCat(
                        f.name, " is ", f.value, " (the worker's optimizer); "
                        "this job runs ", *f.mine, " (",
                        f.given ? absl::StrCat("--", f.name, " on the shards")
                                : "set by the first worker's optimizer",
                        "): expected the same ", f.name, " on every worker, "
                        "and a shard flag that agrees or is left out")));
    }
  }
  for (const Field& f : fields) {
    if (!f.has) continue;
    const bool ok = f.name[0] == 'e' ? f.value > 0 && std::isfinite(f.value)
                                     : f.value >= 0 && f.value < 1;
    if (!ok) {
      return Reject(v1::REJECT_REASON_INVALID_FIELD,
                    absl::InvalidArgumentError(absl::StrCat(
                        "adam_hyper.", f.name, " is ", f.value, "; expected ",
                        f.name[0] == 'e' ? "eps > 0" : "0 <= beta < 1")));
    }
  }
  for (const Field& f : fields) {
    if (f.has) *f.mine = f.value;
  }
  return absl::OkStatus();
}

}  // namespace pserver
