// Client: each shard's push encoder follows what the shard announces: the
// compression schedule's phase (its codecs) and the optimizer's stage
// (1-bit Adam's freeze, with the frozen preconditioner fetched first).
#include "worker/client.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/fp32_tensor.h"
#include "common/hyper_params.h"
#include "common/mix.h"
#include "common/tensor_codecs.h"
#include "common/rejection.h"
#include "common/validated_tensor.h"

namespace pserver {

absl::Status Client::CheckPhase(size_t s, uint32_t phase) const {
  const CompressionSchedule* schedule = options_.schedule.get();
  const size_t phases = schedule != nullptr ? schedule->num_phases() : 1;
  if (phase >= phases) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", s, " (", calls_->address(s), ") announced schedule phase ",
        phase, "; expected 0..", phases - 1,
        " (the shards and workers need the same --schedule file)"));
  }
  return absl::OkStatus();
}

absl::Status Client::SetPhase(size_t s, uint32_t phase) {
  if (absl::Status st = CheckPhase(s, phase); !st.ok()) return st;
  const CompressionSchedule* schedule = options_.schedule.get();
  if (tensor_plan_phase_[s] != phase) {
    // The slice's tensors (block_topk keeps its blocks in their rows), with
    // the phase's per-tensor codecs if the schedule gives any.
    encoders_[s]->UseTensorCodecs(CodecPlan::ForSlice(
        slots_, replica_.range(s),
        WithExactBuffers(
            slots_, schedule != nullptr
                        ? schedule->TensorPushCodecs(phase, slots_)
                        : std::vector<const Codec*>(slots_.size(), nullptr))));
    tensor_plan_phase_[s] = phase;
  }
  if (schedule == nullptr) return absl::OkStatus();
  const CodecChoiceSpec* push = schedule->push(phase);
  encoders_[s]->UseCodec(push != nullptr ? push->encoder.get() : nullptr);
  if (s == 0) phase_ = phase;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Preconditioner>> Client::PrepareStage(
    size_t s, v1::OptimizerStage stage) {
  PushEncoder& e = *encoders_[s];
  if (stage == e.stage() || stage != v1::OPTIMIZER_STAGE_COMPRESSION ||
      !e.needs_preconditioner()) {
    return std::optional<Preconditioner>();
  }
  // The slice's frozen variance, chunk by chunk (several in flight).
  const ChunkPlan& plan = plans_[s];
  std::vector<float> v(plan.n);
  std::optional<std::pair<uint64_t, float>> freeze_eps;
  std::vector<absl::Status> got = calls_->FrozenVarianceChunks(
      {s}, {plan.num_chunks()},
      [&](size_t, uint32_t c, v1::GetFrozenVarianceRequest* req) {
        req->set_worker_id(options_.worker_id);
        req->set_chunk(c);
        return absl::OkStatus();
      },
      [&](size_t, uint32_t c, const v1::GetFrozenVarianceResponse& resp) {
        const std::pair<uint64_t, float> fe{resp.freeze_step(), resp.eps()};
        if (!freeze_eps.has_value()) freeze_eps = fe;
        if (resp.chunk() != c || *freeze_eps != fe) {
          return absl::FailedPreconditionError(absl::StrCat(
              "frozen variance chunk ", c, " answered chunk ", resp.chunk(),
              " frozen at step ", resp.freeze_step(), " with eps ", resp.eps(),
              "; expected chunk ", c, " frozen at step ", freeze_eps->first,
              " with eps ", freeze_eps->second));
        }
        absl::StatusOr<ValidatedTensor> valid =
            ValidateTensor(resp.variance(), plan.size(c));
        if (!valid.ok()) {
          return absl::Status(valid.status().code(),
                              absl::StrCat("frozen variance (chunk ", c, "): ",
                                           valid.status().message()));
        }
        valid->DecodeInto(absl::MakeSpan(v).subspan(plan.begin(c), plan.size(c)));
        metrics_.CountVariance(resp.variance().payload().size());
        return absl::OkStatus();
      });
  if (!got[0].ok()) return got[0];
  absl::StatusOr<Preconditioner> d =
      Preconditioner::FromVariance(std::move(v), freeze_eps->second);
  if (!d.ok()) {
    return absl::Status(d.status().code(),
                        absl::StrCat("shard ", s, " (", calls_->address(s),
                                     "): ", d.status().message()));
  }
  return std::optional<Preconditioner>(*std::move(d));
}

absl::Status Client::SetStage(size_t s, v1::OptimizerStage stage) {
  absl::StatusOr<std::optional<Preconditioner>> d = PrepareStage(s, stage);
  if (!d.ok()) return d.status();
  return encoders_[s]->SetStage(stage, *std::move(d));
}

}  // namespace pserver
