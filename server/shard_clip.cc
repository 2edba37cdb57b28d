// Shard: clipping the round's mean gradient by its global norm
// (PushRequest.clip_norm), as DDP clips. The norm spans every shard, and
// shards do not talk to each other: once a clipped round is summed the
// shard holds it, answers each worker's norm-part pull with its share of
// the squared norm, and steps when the first weights pull brings the total
// (the sum of the shards' parts, which every worker computes alike). The
// exchange costs each worker one small pull per shard per step, one round
// trip, and moves no weights.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rejection.h"
#include "server/internal/shard_common.h"
#include "server/shard.h"

namespace pserver {

absl::Status Shard::CheckClip(const v1::PushRequest& req) const {
  const float clip = req.clip_norm();
  if (clip != 0.0f) {
    if (!(clip > 0.0f) || !std::isfinite(clip)) {
      return Reject(v1::REJECT_REASON_INVALID_FIELD,
                    absl::InvalidArgumentError(absl::StrCat(
                        "clip_norm is ", clip,
                        "; expected a finite value > 0, or 0 for none")));
    }
    if (policy_.relaxed()) {
      return Reject(v1::REJECT_REASON_INVALID_FIELD,
                    absl::InvalidArgumentError(
                        "clip_norm is set; clipping the round's mean needs "
                        "--consistency=bsp (clip per worker instead)"));
    }
    if (req.momentum() ||
        req.space() == v1::GRADIENT_SPACE_PRECONDITIONED) {
      return Reject(
          v1::REJECT_REASON_INVALID_FIELD,
          absl::InvalidArgumentError(absl::StrCat(
              "clip_norm is set at step ", step_, ", where pushes carry ",
              req.momentum() ? "the workers' momentum"
                             : "preconditioned gradients",
              " (1-bit Adam's compression stage); expected gradients in the "
              "raw space: clip per worker with this optimizer")));
    }
  }
  if (round_.received() > 0 && clip != round_clip_) {
    return Reject(v1::REJECT_REASON_HYPER_MISMATCH,
                  absl::FailedPreconditionError(absl::StrCat(
                      "clip_norm is ", clip, "; round ", step_,
                      " has clip_norm ", round_clip_,
                      " from its first push (every worker must clip the "
                      "same)")));
  }
  return absl::OkStatus();
}

ElementRanges Shard::ParameterRanges() const {
  ElementRanges out;
  uint64_t at = 0;
  for (const auto& [b, e] : buffers_) {
    if (b > at) out.emplace_back(at, b);
    at = e;
  }
  if (at < range_.size()) out.emplace_back(at, range_.size());
  return out;
}

PullAnswer Shard::NormPartAnswer(uint64_t step, double part) const {
  v1::PullResponse header;
  header.set_step(step);
  header.set_norm_part(part);
  return MakePullAnswer(header, v1::EncodedTensor(), "");
}

void Shard::ClipMean(absl::Span<float> mean, double total) {
  // torch.nn.utils.clip_grad_norm_'s coefficient, on the round's mean.
  const double coef = std::min(
      1.0, static_cast<double>(round_clip_) / (std::sqrt(total) + 1e-6));
  if (coef < 1.0) {
    for (const auto& [b, e] : ParameterRanges()) {
      for (uint64_t i = b; i < e; ++i) {
        mean[i] = static_cast<float>(mean[i] * coef);
      }
    }
  }
  clipped_step_ = static_cast<int64_t>(step_);
  clipped_part_ = clip_part_;
}

bool Shard::HoldForClip(std::vector<Ready>* ready) {
  if (round_clip_ <= 0.0f) return false;
  if (!clip_held_) {
    clip_held_ = true;
    clip_part_ = round_.MeanSquaredNorm(ParameterRanges());
    for (PullWaiters::Waiter& w : waiters_.TakeNormParts(step_ + 1)) {
      ready->push_back([done = std::move(w.done),
                        answer = NormPartAnswer(step_ + 1, clip_part_)] {
        done(absl::OkStatus(), answer);
      });
    }
  }
  return true;
}

bool Shard::PullForClip(const v1::PullRequest& req, PullDone* done,
                        absl::Status* error, PullAnswer* answer,
                        uint64_t* parked, std::vector<Ready>* ready) {
  const uint64_t t = req.step();
  if (req.norm_part()) {
    if (req.chunk() != 0) {
      *error = Reject(v1::REJECT_REASON_INVALID_FIELD,
                      absl::InvalidArgumentError(absl::StrCat(
                          "chunk is ", req.chunk(),
                          "; expected 0 with norm_part")));
    } else if (clip_held_ && t == step_ + 1) {
      *answer = NormPartAnswer(t, clip_part_);
    } else if (clipped_step_ >= 0 &&
               t == static_cast<uint64_t>(clipped_step_) + 1) {
      *answer = NormPartAnswer(t, clipped_part_);  // stepped already
    } else if (t == step_ + 1) {
      *parked = waiters_.Add(req, std::move(*done), clock_->Now());
    } else {
      *error = Reject(v1::REJECT_REASON_STALE_STEP,
                      absl::FailedPreconditionError(absl::StrCat(
                          "norm_part of step ", t, "; the shard is at step ",
                          step_, " and round ", t - 1,
                          " is neither held nor the last one clipped")));
    }
    return true;
  }
  if (!req.has_round_squared_norm()) return false;
  const double total = req.round_squared_norm();
  if (!(total >= 0.0) || !std::isfinite(total)) {
    *error = Reject(v1::REJECT_REASON_INVALID_FIELD,
                    absl::InvalidArgumentError(absl::StrCat(
                        "round_squared_norm is ", total,
                        "; expected a finite value >= 0")));
    return true;
  }
  if (clip_held_ && t == step_ + 1) {
    for (Ready& r : CompleteRound(total)) ready->push_back(std::move(r));
  }
  return false;  // answered as any pull of step t
}

}  // namespace pserver
