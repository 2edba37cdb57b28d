// How one shard's slice of the worker's gradient becomes a push: the codec
// of the optimizer's stage (warmup_codec during 1-bit Adam's warmup, the push
// codec after the freeze and always for optimizers without one), error
// feedback per stage (common/error_feedback.h), and after the freeze the
// frozen preconditioner when the shard expects preconditioned gradients
// (worker/preconditioner.h). Follows the shard's stage: entering compression
// carries the warmup residual over into the compression residual (scaled by
// D in the preconditioned space) so no gradient mass is lost; going back to
// warmup (a shard that restarted from nothing) clears both residuals.
// With a momentum beta (the shard's RegisterResponse.worker_momentum), the
// compression stage pushes the worker's momentum u = beta * u + (1 - beta) *
// g (in the compression space, u = 0 at the freeze) instead of g.
#ifndef PSERVER_WORKER_PUSH_ENCODER_H_
#define PSERVER_WORKER_PUSH_ENCODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/error_feedback.h"
#include "common/tensor_codecs.h"
#include "pserver/v1/parameter_server.pb.h"
#include "worker/preconditioner.h"

namespace pserver {

// out = beta u + (1 - beta) g (the workers' momentum); returns the largest
// AbsBits of out (common/norms.h), taken in the same pass: MaxAbsOfBits of
// it is the bound the error feedback gets. The arrays must not overlap.
uint32_t MixTaking(float beta, const float* u, const float* g, float* out,
                   size_t n);

struct PushCodecs {
  v1::Codec push = v1::CODEC_ONEBIT;
  v1::CodecParams push_params;
  v1::Codec warmup = v1::CODEC_FP32;
  v1::CodecParams warmup_params;
  float ef_decay = 1.0f;  // 1 = exact error feedback
  // Momentum-factor masking (Lin et al. 2018, Deep Gradient Compression):
  // with the workers' momentum and a sparse push codec, the momentum of
  // every element a push carried restarts from zero, so a gradient that was
  // sent does not keep being pushed by the momentum it left behind. Needs
  // the shards' worker momentum and a sparse `push` (topk, randomk,
  // block_topk, topk_quantize); dense pieces of a push are never masked.
  bool momentum_masking = false;
};

// Whether `codec` sends a subset of the elements (and decodes the rest as
// zero): topk, randomk, block_topk, topk_quantize.
bool IsSparseCodec(v1::Codec codec);

// Thread-compatible: one per shard, driven by the Client's thread.
class PushEncoder {
 public:
  // An encoder for an n-element slice, in the warmup stage with zero
  // residuals. `freezes`: the shards' optimizer has a compression stage
  // (1-bit Adam); `space`: the gradient space it expects after the freeze;
  // `momentum_beta`: > 0 when the compression stage pushes the worker's
  // momentum with this decay (0: the gradient).
  // INVALID_ARGUMENT for a codec that cannot be built or a beta outside
  // [0, 1).
  static absl::StatusOr<std::unique_ptr<PushEncoder>> Create(
      const PushCodecs& codecs, uint64_t n, bool freezes,
      v1::GradientSpace space, float momentum_beta = 0.0f);

  // Sets req's space and gradient from `g`, one chunk of this shard's slice
  // (its elements [offset, offset + g.size())), and updates that piece of
  // the stage's residual. `seed` seeds the encoder's randomness.
  // INVALID_ARGUMENT (residual unchanged) for a non-finite input or a piece
  // outside the slice. `bound`: an upper bound of every |g[i]| the caller
  // knows (its finite check's MaxAbs), or negative; it spares the encoder
  // its own pass over what it encodes (ErrorFeedback::EncodeAt).
  // `held`: the shard's values of the chunk as this worker holds them (its
  // replica), or empty: a raw piece (a buffer) equal to them bit for bit is
  // sent as CODEC_UNCHANGED (common/unchanged.h), i.e. as nothing.
  absl::Status EncodeChunk(absl::Span<const float> g, uint64_t offset,
                           uint64_t seed, v1::PushRequest* req,
                           double bound = -1.0,
                           absl::Span<const float> held = {});

  v1::OptimizerStage stage() const { return stage_; }
  // A compression schedule's push codec for every stage from now on
  // (nullptr: the configured warmup and push codecs again); the residuals
  // carry over. `codec` must outlive its use here (the schedule owns it).
  void UseCodec(const Codec* codec) {
    warmup_ef_->UseCodec(codec);
    push_ef_->UseCodec(codec);
  }
  // A schedule phase's per-tensor codecs over this slice, in every stage
  // (tensors without one keep the stage's codec); CodecPlan() for none.
  void UseTensorCodecs(CodecPlan plan) {
    plan_ = std::move(plan);
    absent_plan_ = plan_.WithoutGradient(absent_);
  }
  // Slice-local ranges [begin, end) of the parameter tensors without a
  // gradient in the coming pushes, until set again (sorted, disjoint):
  // sent as CODEC_NO_GRADIENT, their residuals and momentum left as they
  // are, whatever the gradient holds there.
  void SetWithoutGradient(
      const std::vector<std::pair<uint64_t, uint64_t>>& absent) {
    if (absent == absent_) return;
    absent_ = absent;
    absent_plan_ = plan_.WithoutGradient(absent_);
  }
  // Slice-local ranges [begin, end) pushed as they are in every stage
  // (buffers, v1::TENSOR_KIND_BUFFER): neither preconditioned nor turned
  // into the worker's momentum. Their codec is the plan's (fp32 for
  // buffers: common/tensor_codecs.h WithExactBuffers). Sorted, disjoint
  // (common/unchanged.h BufferRanges).
  void SetRawRanges(std::vector<std::pair<uint64_t, uint64_t>> ranges) {
    raw_ = std::move(ranges);
  }
  // Whether entering the compression stage needs the shard's frozen
  // variance (1-bit Adam, non-empty slice).
  bool needs_preconditioner() const { return freezes_ && n_ > 0; }
  // Follows the shard to `stage`. Entering compression takes `d` when
  // needs_preconditioner() (REQUIRES: then d is set, of size n). An error
  // only if the carried-over residual is not finite (residuals unchanged).
  absl::Status SetStage(v1::OptimizerStage stage,
                        std::optional<Preconditioner> d);

  // The compression stage's momentum (empty: none yet, or all zeros), for
  // Client::SaveState / LoadState. SetMomentum: INVALID_ARGUMENT (nothing
  // changed) unless empty or of size n and finite.
  absl::Span<const float> momentum() const { return u_; }
  absl::Status SetMomentum(absl::Span<const float> u);
  float momentum_beta() const { return beta_; }

  // The residuals, for Client::SaveState / LoadState.
  ErrorFeedback& warmup_ef() { return *warmup_ef_; }
  ErrorFeedback& push_ef() { return *push_ef_; }
  const ErrorFeedback& warmup_ef() const { return *warmup_ef_; }
  const ErrorFeedback& push_ef() const { return *push_ef_; }

 private:
  PushEncoder(uint64_t n, bool freezes, v1::GradientSpace space, float beta,
              bool masking, std::unique_ptr<ErrorFeedback> warmup_ef,
              std::unique_ptr<ErrorFeedback> push_ef);
  // EncodeChunk without `held`.
  absl::Status Encode(absl::Span<const float> g, uint64_t offset,
                      uint64_t seed, v1::PushRequest* req, double bound);
  // Momentum-factor masking: next_u_[i] = 0 for every element the sparse
  // pieces of `sent` (this chunk's push) carry.
  absl::Status MaskSent(const v1::EncodedTensor& sent);

  const uint64_t n_;
  const bool freezes_;
  const v1::GradientSpace space_;
  const float beta_;              // > 0: push the momentum after the freeze
  const bool masking_;            // momentum-factor masking
  std::vector<float> sent_;       // MaskSent's decoded chunk
  std::vector<float> u_;          // that momentum (allocated when first used)
  std::vector<float> next_u_;     // one chunk's new momentum, until encoded
  std::unique_ptr<ErrorFeedback> warmup_ef_;
  std::unique_ptr<ErrorFeedback> push_ef_;
  CodecPlan plan_;                // per-tensor codecs (uniform: none)
  std::vector<std::pair<uint64_t, uint64_t>> absent_;  // SetWithoutGradient
  CodecPlan absent_plan_;         // plan_ with absent_ as no gradient
  std::vector<std::pair<uint64_t, uint64_t>> raw_;  // SetRawRanges
  std::vector<float> patched_;    // a preconditioned chunk with raw pieces
  std::optional<Preconditioner> d_;  // once frozen (1-bit Adam)
  v1::OptimizerStage stage_ = v1::OPTIMIZER_STAGE_WARMUP;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_PUSH_ENCODER_H_
