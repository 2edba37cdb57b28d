// Client: one training step. Step(gradient), or the same overlapped with
// the caller's backward pass (StartStep, GradientReady, FinishStep): the
// push of every chunk (worker/ready_chunks.h) on a background thread, then
// recovery for shards that refused, then the pull of every chunk (client_pull.cc).
#include <cmath>
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/mix.h"
#include "common/norms.h"
#include "worker/client.h"

namespace pserver {

absl::Status Client::EncodeChunk(size_t s, uint32_t c,
                                 absl::Span<const float> gradient,
                                 double bound, v1::PushRequest* req) {
  const ShardRange& r = replica_.range(s);
  const ChunkPlan& plan = plans_[s];
  const uint64_t step = replica_.step(s);
  req->set_worker_id(options_.worker_id);
  req->set_step(step);
  req->set_chunk(c);
  *req->mutable_hyper() = hyper_;
  req->set_clip_norm(clip_norm_);
  uint64_t seed = MixPair(MixPair(options_.seed, options_.worker_id),
                          MixPair(step, s));
  if (c > 0) seed = MixPair(seed, c);
  // Under bsp the replica is what the shard serves for this step: buffers
  // equal to it go as nothing. Under ssp and async the shard may be steps
  // ahead of the replica, so they go as they are.
  absl::Span<const float> held;
  if (!relaxed()) {
    held = replica_.slice(s).subspan(plan.begin(c), plan.size(c));
  }
  {
    static const ElementRanges kNone;
    absl::MutexLock lock(&no_gradient_mu_);
    encoders_[s]->SetWithoutGradient(s < no_gradient_.size() ? no_gradient_[s]
                                                             : kNone);
    req->set_overflow(overflow_);
  }
  absl::Status st = encoders_[s]->EncodeChunk(
      gradient.subspan(r.begin + plan.begin(c), plan.size(c)), plan.begin(c),
      seed, req, bound, held);
  if (!st.ok()) return st;
  std::vector<v1::EncodedTensor>& kept = sent_[s];
  if (kept.size() != plan.num_chunks()) kept.resize(plan.num_chunks());
  if (req->gradient().codec() != v1::CODEC_FP32) {
    kept[c] = req->gradient();
  } else {
    kept[c].Clear();
  }
  sent_space_[s] = req->space();
  sent_momentum_[s] = req->momentum() ? 1 : 0;
  return absl::OkStatus();
}

absl::Status Client::Step(absl::Span<const float> gradient,
                          absl::Span<const uint32_t> no_gradient,
                          bool overflow) {
  if (absl::Status st = CheckStepStart("Step()", gradient); !st.ok()) return st;
  std::vector<uint32_t> parameters;  // with an overflow: all of them
  for (uint32_t t = 0; overflow && t < slots_.size(); ++t) {
    if (!slots_[t].buffer) parameters.push_back(t);
  }
  absl::StatusOr<std::vector<ElementRanges>> absent =
      NoGradientRanges(overflow ? absl::MakeConstSpan(parameters) : no_gradient);
  if (!absent.ok()) return absent.status();
  double max_abs = 0;
  for (const TensorSlot& slot : slots_) {
    if (!overflow) break;  // else only the buffers are read
    if (!slot.buffer) continue;
    double m = 0;
    if (absl::Status st = CheckGradientFinite(
            gradient.subspan(slot.offset, slot.size), slot.offset, &m);
        !st.ok()) {
      return st;
    }
    max_abs = std::max(max_abs, m);
  }
  if (absl::Status st = overflow ? absl::OkStatus()
                                 : CheckGradientFinite(gradient, 0, &max_abs);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = StartStep(gradient); !st.ok()) return st;
  // Checked above: handed over whole, without a second pass.
  NoteGradientBound(max_abs);
  {
    absl::MutexLock lock(&no_gradient_mu_);
    no_gradient_ = *std::move(absent);
    overflow_ = overflow;
  }
  ABSL_RAW_CHECK(ready_.Mark(0, gradient.size()).ok(), "Step: bad range");
  return FinishStepNow();
}

absl::StatusOr<std::vector<ElementRanges>> Client::NoGradientRanges(
    absl::Span<const uint32_t> tensors) const {
  std::vector<ElementRanges> out(calls_->size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint32_t t = tensors[i];
    if (t >= slots_.size() || (i > 0 && t <= tensors[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no_gradient[", i, "] is ", t, "; expected increasing tensor "
          "indices below ", slots_.size(), " (the layout's tensors)"));
    }
    const TensorSlot& slot = slots_[t];
    if (slot.buffer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no_gradient[", i, "] is tensor ", t, " ('", slot.name,
          "'), a buffer; expected parameter tensors only"));
    }
    for (size_t s = 0; s < out.size(); ++s) {
      const ShardRange& r = replica_.range(s);
      const uint64_t b = std::max(slot.offset, r.begin);
      const uint64_t e = std::min(slot.offset + slot.size, r.end);
      if (b < e) out[s].emplace_back(b - r.begin, e - r.begin);
    }
  }
  return out;
}

absl::Status Client::CheckReadyRange(uint64_t begin, uint64_t end) {
  double max_abs = 0;
  if (absl::Status st = CheckGradientFinite(
          step_gradient_.subspan(begin, end - begin), begin, &max_abs);
      !st.ok()) {
    return st;
  }
  NoteGradientBound(max_abs);
  return absl::OkStatus();
}

void Client::NoteGradientBound(double max_abs) {
  const uint32_t bits = AbsBits(static_cast<float>(max_abs));
  uint32_t now = gradient_bound_bits_.load(std::memory_order_relaxed);
  while (now < bits && !gradient_bound_bits_.compare_exchange_weak(
                           now, bits, std::memory_order_relaxed)) {
  }
}

double Client::GradientBound() const {
  return MaxAbsOfBits(gradient_bound_bits_.load(std::memory_order_relaxed));
}

absl::Status Client::CheckStepStart(const char* what,
                                    absl::Span<const float> gradient) const {
  if (!registered_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " before Register()"));
  }
  if (pusher_.joinable()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " while a step is in progress; call FinishStep() first"));
  }
  if (gradient.size() != num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient has ", gradient.size(), " elements; expected ",
                     num_params()));
  }
  return absl::OkStatus();
}

absl::Status Client::StartStep(absl::Span<const float> gradient) {
  if (absl::Status st = CheckStepStart("StartStep()", gradient); !st.ok()) {
    return st;
  }
  const size_t n = calls_->size();
  std::vector<ShardRange> ranges(n);
  for (size_t s = 0; s < n; ++s) ranges[s] = replica_.range(s);
  {
    absl::MutexLock lock(&no_gradient_mu_);
    no_gradient_.clear();
    overflow_ = false;
  }
  ready_.Reset(num_params(), ranges, plans_);
  // Nothing of this step is sent yet: a resend must not take a chunk of the
  // last step's (the strings keep their capacity).
  for (std::vector<v1::EncodedTensor>& kept : sent_) {
    for (v1::EncodedTensor& t : kept) t.Clear();
  }
  step_gradient_ = gradient;
  gradient_bound_bits_.store(0, std::memory_order_relaxed);
  encoding_ = absl::ZeroDuration();
  push_start_ = absl::Now();
  pusher_ = std::thread([this] {
    // Chunks are encoded just before they are sent, in the order they
    // became ready, while earlier chunks are on the wire and the caller
    // computes the rest: the encode time is counted apart from the push.
    const size_t shards = calls_->size();
    std::vector<size_t> all(shards);
    std::vector<uint32_t> chunks(shards);
    for (size_t s = 0; s < shards; ++s) {
      all[s] = s;
      chunks[s] = plans_[s].num_chunks();
    }
    pushed_ = calls_->PushChunks(
        all, chunks,
        [this](size_t s, uint32_t c, v1::PushRequest* req) {
          const absl::Time t = absl::Now();
          absl::Status st =
              EncodeChunk(s, c, step_gradient_, GradientBound(), req);
          encoding_ += absl::Now() - t;
          if (st.ok()) {
            metrics_.CountPush(PayloadBytes(req->gradient()),
                               Fp32Bytes(plans_[s].size(c)));
          }
          return st;
        },
        [](size_t, uint32_t, const v1::PushResponse&) {
          return absl::OkStatus();
        },
        [this](size_t s) { return ready_.Take(s); }, &push_interrupted_);
  });
  return absl::OkStatus();
}

absl::Status Client::CheckGradientFinite(absl::Span<const float> values,
                                         uint64_t offset, double* max_abs) {
  // One vectorized pass over the bits (common/norms.h): +inf for a NaN or
  // an infinity.
  *max_abs = MaxAbs(values);
  if (std::isfinite(*max_abs)) return absl::OkStatus();
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient[", offset + i, "] is ", values[i],
                       "; expected a finite value"));
    }
  }
  return absl::OkStatus();
}

absl::Status Client::GradientReady(uint64_t begin, uint64_t end) {
  if (!pusher_.joinable()) {
    return absl::FailedPreconditionError(
        "GradientReady() outside a step; call StartStep() first");
  }
  if (begin < end && end <= step_gradient_.size()) {
    if (absl::Status st = CheckReadyRange(begin, end); !st.ok()) return st;
  }
  return ready_.Mark(begin, end);
}

absl::Status Client::FinishStep(absl::Span<const uint32_t> no_gradient) {
  if (!pusher_.joinable()) {
    return absl::FailedPreconditionError(
        "FinishStep() outside a step; call StartStep() first");
  }
  absl::StatusOr<std::vector<ElementRanges>> absent =
      NoGradientRanges(no_gradient);
  if (!absent.ok()) return absent.status();
  const std::vector<std::pair<uint64_t, uint64_t>> missing =
      no_gradient.empty() ? std::vector<std::pair<uint64_t, uint64_t>>()
                          : ready_.Missing();
  for (const uint32_t t : no_gradient) {
    const TensorSlot& slot = slots_[t];
    const bool held_back = slot.size == 0 || std::any_of(
        missing.begin(), missing.end(), [&](const auto& m) {
          return m.first <= slot.offset && slot.offset + slot.size <= m.second;
        });
    if (!held_back) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no_gradient names tensor ", t, " ('", slot.name,
          "'), whose gradient was handed over; expected tensors not handed "
          "over"));
    }
  }
  {
    absl::MutexLock lock(&no_gradient_mu_);
    no_gradient_ = *std::move(absent);
  }
  return FinishStepNow();
}

absl::Status Client::FinishStepNow() {
  // What was not handed over is handed over now, all checked first: a
  // non-finite value leaves the step in progress (fix it, call again).
  const std::vector<std::pair<uint64_t, uint64_t>> missing = ready_.Missing();
  for (const auto& [b, e] : missing) {
    if (absl::Status st = CheckReadyRange(b, e); !st.ok()) return st;
  }
  for (const auto& [b, e] : missing) {
    // Disjoint from everything marked, by construction.
    ABSL_RAW_CHECK(ready_.Mark(b, e).ok(), "FinishStep: bad missing range");
  }
  pusher_.join();
  const absl::Span<const float> gradient = step_gradient_;
  step_gradient_ = {};
  const size_t n = calls_->size();
  const PendingPush push{gradient, GradientBound()};
  std::vector<bool> snapshot(n, false);
  // A shard that went on without this worker may be many rounds ahead (the
  // worker stalled longer than its lease): the pull is of the step the
  // rounds are at now.
  uint64_t pull_step = replica_.step() + 1;
  // A shard more than a round past this worker's step: it fell behind the
  // rounds (stalled past its lease), and the shards may be at different
  // steps (one of them waiting for this worker's push of the older one).
  bool behind = false;
  auto recover = [&](size_t s, const absl::Status& refused) -> absl::Status {
    const Recovery r = RecoveryFor(refused);
    if (r == Recovery::kFail) return refused;
    absl::StatusOr<uint64_t> now = Recover(s, r, push);
    if (!now.ok()) return now.status();
    if (!relaxed() && *now > replica_.step() + 1) behind = true;
    if (r == Recovery::kRejoinNextRound) pull_step = std::max(pull_step, *now);
    snapshot[s] = true;  // its replica is not ours any more
    return absl::OkStatus();
  };
  // The shards that refused first, then those whose push stopped for it:
  // their answers may wait on workers that wait for this one's rejoin.
  for (size_t s = 0; s < n; ++s) {
    if (pushed_[s].ok() || push_interrupted_[s]) continue;
    if (absl::Status st = recover(s, pushed_[s]); !st.ok()) return st;
  }
  for (size_t s = 0; s < n; ++s) {
    if (!push_interrupted_[s]) continue;
    if (absl::Status st = Resend(s, /*reencode=*/false, push); !st.ok()) {
      if (absl::Status r = recover(s, st); !r.ok()) return r;
    }
  }
  metrics_.AddEncodeSeconds(absl::ToDoubleSeconds(encoding_));
  metrics_.AddPushSeconds(
      absl::ToDoubleSeconds(absl::Now() - push_start_ - encoding_));
  const absl::Time pull_start = absl::Now();
  round_skipped_.store(false, std::memory_order_relaxed);
  // The shards hold the summed round until a pull brings its norm. A shard
  // that lost this worker's push meanwhile (it restarted) is recovered as
  // a refused push is, and asked again.
  for (int attempt = 0; clip_norm_ > 0.0f && !behind; ++attempt) {
    absl::Status refused;
    size_t s = n;
    absl::StatusOr<double> total = RoundSquaredNorm(pull_step, &refused, &s);
    if (total.ok()) {
      round_norm_sq_ = *total;
      break;
    }
    // One refused shard recovered per attempt: up to 4 tries for each.
    if (s == n || attempt >= 4 * static_cast<int>(n)) return total.status();
    if (absl::Status r = recover(s, refused); !r.ok()) return r;
  }
  absl::Status st =
      behind ? Resync() : PullAll(pull_step, std::move(snapshot), &push);
  round_norm_sq_.reset();
  metrics_.AddPullSeconds(absl::ToDoubleSeconds(absl::Now() - pull_start));
  if (!st.ok()) return st;
  metrics_.CountStep();
  return absl::OkStatus();
}

}  // namespace pserver
