#include "worker/push_encoder.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"

namespace pserver {

absl::StatusOr<std::unique_ptr<PushEncoder>> PushEncoder::Create(
    const PushCodecs& codecs, uint64_t n, bool freezes,
    v1::GradientSpace space) {
  absl::StatusOr<std::unique_ptr<Codec>> warmup =
      MakeCodec(codecs.warmup, codecs.warmup_params);
  if (!warmup.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_codec: ", warmup.status().message()));
  }
  absl::StatusOr<std::unique_ptr<Codec>> push =
      MakeCodec(codecs.push, codecs.push_params);
  if (!push.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push_codec: ", push.status().message()));
  }
  return std::unique_ptr<PushEncoder>(new PushEncoder(
      n, freezes, space,
      std::make_unique<ErrorFeedback>(*std::move(warmup), n, codecs.ef_decay),
      std::make_unique<ErrorFeedback>(*std::move(push), n, codecs.ef_decay)));
}

PushEncoder::PushEncoder(uint64_t n, bool freezes, v1::GradientSpace space,
                         std::unique_ptr<ErrorFeedback> warmup_ef,
                         std::unique_ptr<ErrorFeedback> push_ef)
    : n_(n),
      freezes_(freezes),
      space_(space),
      warmup_ef_(std::move(warmup_ef)),
      push_ef_(std::move(push_ef)) {}

absl::Status PushEncoder::EncodeChunk(absl::Span<const float> g,
                                      uint64_t offset, uint64_t seed,
                                      v1::PushRequest* req) {
  const bool compressing = stage_ == v1::OPTIMIZER_STAGE_COMPRESSION;
  if (compressing && space_ == v1::GRADIENT_SPACE_PRECONDITIONED) {
    // No D only for an empty slice (needs_preconditioner() is false).
    if (d_.has_value()) g = d_->Apply(g, offset);
    req->set_space(v1::GRADIENT_SPACE_PRECONDITIONED);
  } else {
    req->set_space(v1::GRADIENT_SPACE_RAW);
  }
  ErrorFeedback& ef = !freezes_ || compressing ? *push_ef_ : *warmup_ef_;
  return ef.EncodeAt(offset, g, seed, req->mutable_gradient());
}

absl::Status PushEncoder::SetStage(v1::OptimizerStage stage,
                                   std::optional<Preconditioner> d) {
  if (stage == stage_) return absl::OkStatus();
  if (stage == v1::OPTIMIZER_STAGE_COMPRESSION) {
    if (d.has_value()) {
      // Carry the warmup residual over into the compression-stage residual
      // (in its space), so nothing the warmup codec dropped is lost.
      // (An empty residual is all zeros: nothing to carry.)
      absl::Span<const float> e = warmup_ef_->residual();
      std::vector<float> moved(e.begin(), e.end());
      if (space_ == v1::GRADIENT_SPACE_PRECONDITIONED && !moved.empty()) {
        d->ScaleInPlace(absl::MakeSpan(moved));
      }
      if (absl::Status s = push_ef_->SetResidual(moved); !s.ok()) return s;
      d_ = std::move(d);
    }
    stage_ = stage;
    return absl::OkStatus();
  }
  // Back to warmup: the shard restarted from nothing, so its frozen
  // variance and the residuals measured against it are gone.
  d_.reset();
  warmup_ef_->Reset();
  push_ef_->Reset();
  stage_ = stage;
  return absl::OkStatus();
}

}  // namespace pserver
