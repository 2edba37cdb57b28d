#include "worker/push_encoder.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/internal/cpu.h"
#include "common/norms.h"
#include "common/unchanged.h"

namespace pserver {
PSERVER_CLONES_AVX2 uint32_t MixTaking(float beta, const float* __restrict u,
                                       const float* __restrict g,
                                       float* __restrict out, size_t n) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = beta * u[i] + (1.0f - beta) * g[i];
    top = std::max(top, AbsBits(out[i]));
  }
  return top;
}

bool IsSparseCodec(v1::Codec codec) {
  return codec == v1::CODEC_TOPK || codec == v1::CODEC_RANDOMK ||
         codec == v1::CODEC_BLOCK_TOPK || codec == v1::CODEC_TOPK_QUANTIZE;
}

absl::StatusOr<std::unique_ptr<PushEncoder>> PushEncoder::Create(
    const PushCodecs& codecs, uint64_t n, bool freezes,
    v1::GradientSpace space, float momentum_beta) {
  if (!(momentum_beta >= 0.0f && momentum_beta < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker_momentum is ", momentum_beta, "; expected [0, 1)"));
  }
  if (codecs.momentum_masking) {
    if (!IsSparseCodec(codecs.push)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "momentum_masking needs a sparse push codec (topk, randomk, "
          "block_topk or topk_quantize); push codec is ",
          CodecName(codecs.push)));
    }
    if (!freezes || momentum_beta == 0.0f) {
      return absl::InvalidArgumentError(
          "momentum_masking needs the workers' momentum: the shards' "
          "optimizer onebit_adam with --onebit_momentum=worker");
    }
  }
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
      n, freezes, space, momentum_beta, codecs.momentum_masking,
      std::make_unique<ErrorFeedback>(*std::move(warmup), n, codecs.ef_decay),
      std::make_unique<ErrorFeedback>(*std::move(push), n, codecs.ef_decay)));
}

PushEncoder::PushEncoder(uint64_t n, bool freezes, v1::GradientSpace space,
                         float beta, bool masking,
                         std::unique_ptr<ErrorFeedback> warmup_ef,
                         std::unique_ptr<ErrorFeedback> push_ef)
    : n_(n),
      freezes_(freezes),
      space_(space),
      beta_(beta),
      masking_(masking),
      warmup_ef_(std::move(warmup_ef)),
      push_ef_(std::move(push_ef)) {}

absl::Status PushEncoder::EncodeChunk(absl::Span<const float> g,
                                      uint64_t offset, uint64_t seed,
                                      v1::PushRequest* req, double bound,
                                      absl::Span<const float> held) {
  if (!held.empty() && held.size() != g.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "held holds ", held.size(), " elements; expected ", g.size(),
        " (the chunk's)"));
  }
  absl::Status s = Encode(g, offset, seed, req, bound);
  if (!s.ok() || held.empty() || raw_.empty()) return s;
  // A buffer piece that is what the shard serves already: sent as nothing.
  MarkUnchanged(req->mutable_gradient(), offset, raw_,
                [&](uint64_t begin, absl::string_view fp32) {
                  return std::memcmp(fp32.data(), held.data() + (begin - offset),
                                     fp32.size()) == 0;
                });
  return absl::OkStatus();
}

absl::Status PushEncoder::Encode(absl::Span<const float> g, uint64_t offset,
                                 uint64_t seed, v1::PushRequest* req,
                                 double bound) {
  const bool compressing = stage_ == v1::OPTIMIZER_STAGE_COMPRESSION;
  const absl::Span<const float> given = g;
  const double given_bound = bound;
  // Copies given's raw ranges (buffers) over `out`, this chunk's elements;
  // `bound` then also covers them (unknown stays unknown).
  auto keep_raw = [&](float* out) {
    const uint64_t end = offset + given.size();
    bool any = false;
    for (const auto& [b, e] : raw_) {
      const uint64_t lo = std::max(b, offset), hi = std::min(e, end);
      for (uint64_t i = lo; i < hi; ++i) out[i - offset] = given[i - offset];
      any = any || lo < hi;
    }
    if (any) bound = given_bound >= 0.0 ? std::max(bound, given_bound) : -1.0;
  };
  if (compressing && space_ == v1::GRADIENT_SPACE_PRECONDITIONED) {
    // No D only for an empty slice (needs_preconditioner() is false).
    if (d_.has_value()) {
      g = d_->Apply(g, offset, &bound);
      if (!raw_.empty()) {
        patched_.assign(g.begin(), g.end());
        keep_raw(patched_.data());
        g = patched_;
      }
    }
    req->set_space(v1::GRADIENT_SPACE_PRECONDITIONED);
  } else {
    req->set_space(v1::GRADIENT_SPACE_RAW);
  }
  ErrorFeedback& ef = !freezes_ || compressing ? *push_ef_ : *warmup_ef_;
  const CodecPlan& plan = absent_.empty() ? plan_ : absent_plan_;
  if (!(compressing && freezes_ && beta_ > 0.0f)) {
    return EncodeWithPlan(plan, ef.codec(), &ef, offset, g, seed,
                          req->mutable_gradient(), bound);
  }
  // The momentum of this chunk, kept only once its push is encoded (a
  // refused gradient changes nothing).
  if (offset > n_ || g.size() > n_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk [", offset, ", ", offset + g.size(), ") is outside the slice of ",
        n_, " elements"));
  }
  if (u_.empty()) u_.assign(n_, 0.0f);
  next_u_.resize(g.size());
  bound = MaxAbsOfBits(
      MixTaking(beta_, u_.data() + offset, g.data(), next_u_.data(), g.size()));
  keep_raw(next_u_.data());
  // A tensor without a gradient keeps its momentum (its piece is not sent).
  for (const auto& [b, e] : absent_) {
    const uint64_t lo = std::max(b, offset);
    const uint64_t hi = std::min<uint64_t>(e, offset + g.size());
    if (lo >= hi) continue;
    std::copy(u_.begin() + lo, u_.begin() + hi, next_u_.begin() + (lo - offset));
    bound = std::max(bound, MaxAbs(absl::MakeConstSpan(u_).subspan(lo, hi - lo)));
  }
  req->set_momentum(true);
  if (absl::Status s = EncodeWithPlan(plan, ef.codec(), &ef, offset, next_u_,
                                      seed, req->mutable_gradient(), bound);
      !s.ok()) {
    return s;
  }
  if (masking_) {
    // The push is encoded and the residual moved: a failure here would
    // lose it, and cannot happen for the encoder's own output.
    if (absl::Status s = MaskSent(req->gradient()); !s.ok()) return s;
  }
  std::copy(next_u_.begin(), next_u_.end(), u_.begin() + offset);
  return absl::OkStatus();
}

absl::Status PushEncoder::MaskSent(const v1::EncodedTensor& sent) {
  auto mask = [this](const v1::EncodedTensor& t,
                     uint64_t begin) -> absl::Status {
    if (!IsSparseCodec(t.codec())) return absl::OkStatus();
    absl::StatusOr<const Codec*> decoder = FindDecoder(t.codec());
    if (!decoder.ok()) return decoder.status();
    const uint64_t len = t.num_elements();
    if (begin > next_u_.size() || len > next_u_.size() - begin) {
      return absl::InternalError("a pushed piece is outside its chunk");
    }
    sent_.assign(len, 0.0f);
    if (absl::Status s = (*decoder)->Decode(t, absl::MakeSpan(sent_));
        !s.ok()) {
      return s;
    }
    for (uint64_t i = 0; i < len; ++i) {
      if (sent_[i] != 0.0f) next_u_[begin + i] = 0.0f;
    }
    return absl::OkStatus();
  };
  if (sent.codec() != v1::CODEC_SEGMENTS) return mask(sent, 0);
  uint64_t begin = 0;
  for (const v1::EncodedTensor& piece : sent.segments()) {
    if (absl::Status s = mask(piece, begin); !s.ok()) return s;
    begin += piece.num_elements();
  }
  return absl::OkStatus();
}

absl::Status PushEncoder::SetMomentum(absl::Span<const float> u) {
  if (!u.empty() && u.size() != n_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "momentum has ", u.size(), " elements; expected 0 or ", n_));
  }
  if (absl::Status s = CheckAllFinite(u, "momentum"); !s.ok()) return s;
  u_.assign(u.begin(), u.end());
  return absl::OkStatus();
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
  u_.clear();
  stage_ = stage;
  return absl::OkStatus();
}

}  // namespace pserver
