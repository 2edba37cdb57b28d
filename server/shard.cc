#include "server/shard.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "server/metrics.h"

namespace pserver {
namespace {

double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double L2Norm(absl::Span<const float> v) {
  double s = 0;
  for (float f : v) s += double{f} * f;
  return std::sqrt(s);
}

uint64_t PullSeed(uint32_t shard, uint64_t step) {
  uint64_t z = (uint64_t{shard} << 48) ^ step ^ 0x5DEECE66DULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void SetFp32(absl::Span<const float> v, v1::EncodedTensor* t) {
  t->Clear();
  t->set_codec(v1::CODEC_FP32);
  t->set_num_elements(v.size());
  t->mutable_payload()->resize(v.size() * sizeof(float));
  if (!v.empty()) {
    std::memcpy(t->mutable_payload()->data(), v.data(),
                v.size() * sizeof(float));
  }
}

const char* SpaceName(v1::GradientSpace s) {
  return s == v1::GRADIENT_SPACE_PRECONDITIONED ? "PRECONDITIONED" : "RAW";
}

}  // namespace

absl::Status ValidateShardConfig(const ShardConfig& c) {
  if (c.num_shards == 0) {
    return absl::InvalidArgumentError("num_shards is 0; expected >= 1");
  }
  if (c.shard_index >= c.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_index is ", c.shard_index, "; expected 0..",
                     c.num_shards - 1));
  }
  if (c.num_workers == 0 || c.num_workers > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_workers is ", c.num_workers, "; expected 1..4096"));
  }
  return ValidateOptimizerConfig(c.optimizer);
}

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(const ShardConfig& config,
                                                     ServerMetrics* metrics) {
  if (absl::Status s = ValidateShardConfig(config); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      MakeCodec(config.pull_codec, config.pull_params);
  if (!codec.ok()) return codec.status();
  std::unique_ptr<Shard> shard(
      new Shard(config, metrics, std::move(codec).value()));
  if (!config.checkpoint_dir.empty()) {
    CheckpointExpectation expect;
    expect.shard_index = config.shard_index;
    expect.num_shards = config.num_shards;
    expect.num_workers = config.num_workers;
    expect.optimizer_kind = static_cast<uint32_t>(config.optimizer.kind);
    std::vector<std::string> refused;
    absl::StatusOr<ShardState> state =
        LoadNewestCheckpoint(config.checkpoint_dir, expect, &refused);
    for (const std::string& r : refused) {
      shard->startup_log_.push_back(absl::StrCat("refused checkpoint ", r));
    }
    if (state.ok()) {
      uint64_t step = state->step;
      if (absl::Status s = shard->RestoreFrom(*std::move(state)); !s.ok()) {
        return s;
      }
      shard->startup_log_.push_back(absl::StrCat(
          "restored step ", step, " from ", config.checkpoint_dir));
    } else {
      shard->startup_log_.push_back(absl::StrCat(
          "no usable checkpoint in ", config.checkpoint_dir, "; starting fresh"));
    }
    if (config.checkpoint_every > 0) {
      Shard* self = shard.get();
      shard->writer_ = std::make_unique<std::thread>([self] { self->WriterLoop(); });
    }
  } else {
    shard->startup_log_.push_back("no checkpoint_dir; starting fresh");
  }
  if (config.lease_timeout > absl::ZeroDuration()) {
    Shard* self = shard.get();
    shard->reaper_ = std::make_unique<std::thread>([self] { self->ReaperLoop(); });
  }
  return shard;
}

Shard::Shard(const ShardConfig& config, ServerMetrics* metrics,
             std::unique_ptr<Codec> pull_codec)
    : config_(config), metrics_(metrics), pull_codec_(std::move(pull_codec)) {
  worker_registered_.assign(config_.num_workers, false);
  last_pushed_.assign(config_.num_workers, -1);
  live_.assign(config_.num_workers, true);
  rejoin_.assign(config_.num_workers, false);
  last_seen_.assign(config_.num_workers, absl::Now());
  pending_.resize(config_.num_workers);
  pending_codec_.resize(config_.num_workers);
}

absl::Status Shard::CheckWorker(uint32_t worker_id,
                                absl::string_view field) const {
  if (worker_id >= config_.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", worker_id, "; expected 0..",
                     config_.num_workers - 1, " (the shard expects ",
                     config_.num_workers, " workers)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterResponse> Shard::Register(
    const v1::RegisterRequest& req) {
  auto reject = [&](absl::string_view reason, absl::Status s) {
    if (metrics_) metrics_->CountRejected(std::string(reason));
    return s;
  };
  if (absl::Status s = CheckWorker(req.worker_id(), "worker_id"); !s.ok()) {
    return reject("unknown_worker", s);
  }
  if (req.num_workers() != config_.num_workers) {
    return reject("config_mismatch",
                  absl::FailedPreconditionError(absl::StrCat(
                      "num_workers is ", req.num_workers(), "; the shard expects ",
                      config_.num_workers)));
  }
  if (req.num_shards() != config_.num_shards ||
      req.shard_index() != config_.shard_index) {
    return reject("config_mismatch",
                  absl::FailedPreconditionError(absl::StrCat(
                      "shard_index/num_shards is ", req.shard_index(), "/",
                      req.num_shards(), "; this shard is ", config_.shard_index,
                      "/", config_.num_shards)));
  }
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(req.layout());
  if (!slots.ok()) return reject("bad_layout", slots.status());

  // Pulls that a fast-forward makes answerable are answered after unlocking.
  std::vector<Ready> ready;
  absl::StatusOr<v1::RegisterResponse> result =
      [&]() -> absl::StatusOr<v1::RegisterResponse> {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard is shutting down");
    v1::RegisterResponse resp;
    if (registered_) {
      std::string diff = FirstLayoutDifference(req.layout(), layout_);
      if (!diff.empty()) {
        return reject("layout_mismatch",
                      absl::FailedPreconditionError(absl::StrCat(
                          "model layout differs from the registered one: ",
                          diff)));
      }
    } else {
      ShardRange range = ShardRangeFor(TotalElements(req.layout()),
                                       config_.num_shards, config_.shard_index);
      const v1::EncodedTensor& init = req.initial_weights();
      absl::StatusOr<std::unique_ptr<Codec>> codec = MakeDecoderFor(init);
      if (!codec.ok()) {
        return reject("invalid_payload",
                      absl::InvalidArgumentError(absl::StrCat(
                          "initial_weights: ", codec.status().message())));
      }
      if (absl::Status s = (*codec)->Validate(init, range.size()); !s.ok()) {
        return reject("invalid_payload",
                      absl::InvalidArgumentError(
                          absl::StrCat("initial_weights: ", s.message())));
      }
      std::vector<float> x(range.size(), 0.0f);
      if (absl::Status s = (*codec)->Decode(init, absl::MakeSpan(x)); !s.ok()) {
        return reject("invalid_payload", s);
      }
      InstallModel(req.layout(), *slots, std::move(x));
      resp.set_initialized_model(true);
    }
    if (req.resume_step() > step_) {
      if (draining_) {
        return absl::UnavailableError(absl::StrCat(
            "resume_step is ", req.resume_step(), " while step ", step_,
            " is being summed; retry"));
      }
      if (received_ > 0) {
        // A worker at resume_step proves round step_ completed before this
        // shard lost it: the pushes queued for it are dropped with it.
        std::fprintf(stderr,
                     "pserver: shard %u drops %u pushes queued for step %lu\n",
                     config_.shard_index, received_,
                     static_cast<unsigned long>(step_));
        std::fill(acc_.begin(), acc_.end(), 0.0f);
        for (auto& p : pending_) p.reset();
        for (auto& c : pending_codec_) c.reset();
        received_ = 0;
        next_ = 0;
        contributors_ = 0;
      }
      FastForward(req.resume_step());
      ready = WakeWaiters();
    }
    worker_registered_[req.worker_id()] = true;
    Touch(req.worker_id());
    if (!live_[req.worker_id()]) {
      if (received_ == 0 && next_ == 0) {
        live_[req.worker_id()] = true;
      } else {
        rejoin_[req.worker_id()] = true;  // the round in progress goes on without it
      }
      std::fprintf(stderr, "pserver: shard %u: worker %u rejoins at step %lu\n",
                   config_.shard_index, req.worker_id(),
                   static_cast<unsigned long>(step_ + (live_[req.worker_id()] ? 0 : 1)));
      PublishLiveness();
    }
    uint32_t count = 0;
    for (bool b : worker_registered_) count += b ? 1 : 0;
    if (metrics_) metrics_->SetWorkersRegistered(count);
    resp.set_shard_begin(range_.begin);
    resp.set_shard_end(range_.end);
    resp.set_current_step(step_);
    resp.set_stage(optimizer_->stage());
    resp.set_freeze_step(optimizer_->freeze_at());
    resp.set_compression_space(config_.optimizer.preconditioned
                                   ? v1::GRADIENT_SPACE_PRECONDITIONED
                                   : v1::GRADIENT_SPACE_RAW);
    return resp;
  }();
  for (Ready& r : ready) r();
  return result;
}

absl::StatusOr<v1::PushResponse> Shard::Push(const v1::PushRequest& req) {
  auto reject = [&](absl::string_view reason, absl::Status s) {
    if (metrics_) metrics_->CountRejected(std::string(reason));
    return s;
  };
  if (absl::Status s = CheckWorker(req.worker_id(), "worker_id"); !s.ok()) {
    return reject("unknown_worker", s);
  }
  uint64_t n;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard is shutting down");
    if (!registered_) {
      return reject("not_registered",
                    absl::FailedPreconditionError(
                        "no model is registered on this shard; call Register "
                        "first"));
    }
    if (!worker_registered_[req.worker_id()]) {
      return reject("not_registered",
                    absl::FailedPreconditionError(absl::StrCat(
                        "worker_id ", req.worker_id(),
                        " has not registered; call Register first")));
    }
    n = range_.size();
  }
  // Payload checks need no state: run them before taking the lock.
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      MakeDecoderFor(req.gradient());
  if (!codec.ok()) {
    return reject("invalid_payload",
                  absl::InvalidArgumentError(
                      absl::StrCat("gradient: ", codec.status().message())));
  }
  if (absl::Status s = (*codec)->Validate(req.gradient(), n); !s.ok()) {
    bool wrong_size = req.gradient().num_elements() != n;
    return reject(wrong_size ? "wrong_size" : "invalid_payload",
                  absl::InvalidArgumentError(
                      absl::StrCat("gradient: ", s.message())));
  }

  std::vector<Ready> ready;
  v1::PushResponse resp;
  mu_.Lock();
  {
    const uint32_t w = req.worker_id();
    absl::Status error;
    std::string reason;
    Touch(w);
    if (req.step() == step_ && !live_[w] && pending_[w] == nullptr) {
      reason = "dropped_worker";
      error = absl::AbortedError(absl::StrCat(
          "worker_id ", w, " was dropped from the rounds (no call within the "
          "lease timeout); step ", step_, " goes on without it; ",
          rejoin_[w] ? absl::StrCat("it is counted again from step ", step_ + 1)
                     : "call Register to rejoin"));
    } else if (req.step() < step_) {
      if (last_pushed_[w] >= static_cast<int64_t>(req.step())) {
        resp.set_duplicate(true);
      } else {
        reason = "stale_step";
        error = absl::AbortedError(absl::StrCat(
            "step is ", req.step(), "; the shard is at step ", step_,
            " and worker ", w, " never pushed that step"));
      }
    } else if (req.step() > step_) {
      reason = "future_step";
      error = absl::FailedPreconditionError(absl::StrCat(
          "step is ", req.step(), "; the shard is at step ", step_,
          " (pull step ", step_, " first)"));
    } else if (pending_[w] != nullptr || next_ > w) {
      resp.set_duplicate(true);
    } else if ((req.space() == v1::GRADIENT_SPACE_UNSPECIFIED
                    ? v1::GRADIENT_SPACE_RAW
                    : req.space()) != optimizer_->expected_space()) {
      reason = "wrong_space";
      error = absl::FailedPreconditionError(absl::StrCat(
          "space is ", SpaceName(req.space()), "; expected ",
          SpaceName(optimizer_->expected_space()), " at step ", step_));
    } else {
      if (received_ == 0) round_start_ = absl::Now();
      pending_[w] = std::make_unique<v1::EncodedTensor>(req.gradient());
      pending_codec_[w] = std::move(codec).value();
      last_pushed_[w] = static_cast<int64_t>(req.step());
      ++received_;
      if (metrics_) {
        metrics_->AddReceived(CodecName(req.gradient().codec()),
                              req.gradient().payload().size(),
                              Fp32Bytes(req.gradient().num_elements()));
      }
      ready = Drain();
    }
    if (!error.ok()) {
      mu_.Unlock();
      return reject(reason, error);
    }
    resp.set_current_step(step_);
  }
  mu_.Unlock();
  for (Ready& r : ready) r();
  return resp;
}

std::vector<Shard::Ready> Shard::Drain() {
  if (draining_) return {};
  draining_ = true;
  const uint32_t w_count = config_.num_workers;
  while (next_ < w_count) {
    if (pending_[next_] == nullptr) {
      if (live_[next_]) break;  // the round waits for this worker
      ++next_;                  // dropped: the round goes on without it
      continue;
    }
    const v1::EncodedTensor* t = pending_[next_].get();
    const Codec* codec = pending_codec_[next_].get();
    // With the next worker's push also here and a large shard, decode it
    // into scratch on a second core meanwhile. The sum stays
    // (acc + d_k) + d_{k+1} element by element, as in the one-core order:
    // decoding into zeros is exact.
    const bool pair = next_ + 1 < w_count && pending_[next_ + 1] != nullptr &&
                      acc_.size() >= (uint64_t{1} << 17);
    const v1::EncodedTensor* t2 = pair ? pending_[next_ + 1].get() : nullptr;
    const Codec* codec2 = pair ? pending_codec_[next_ + 1].get() : nullptr;
    // acc_ belongs to this thread while draining_ is set: decode unlocked so
    // other pushes can be validated and queued meanwhile.
    mu_.Unlock();
    absl::Time start = absl::Now();
    absl::Status s2;
    std::thread second;
    if (pair) {
      scratch_.resize(acc_.size());
      second = std::thread([&] { s2 = codec2->Decode(*t2, absl::MakeSpan(scratch_)); });
    }
    absl::Status s = codec->DecodeAccumulate(*t, 1.0f, absl::MakeSpan(acc_));
    if (pair) {
      second.join();
      float* acc = acc_.data();
      const float* add = scratch_.data();
      ParallelChunks(acc_.size(), [acc, add](uint64_t b, uint64_t e) {
        for (uint64_t i = b; i < e; ++i) acc[i] += add[i];
      });
    }
    if (metrics_) {
      metrics_->ObserveAggregation(SecondsSince(start));
      metrics_->AddDecodedElements(t->num_elements() +
                                   (pair ? t2->num_elements() : 0));
    }
    mu_.Lock();
    // The payloads were validated on arrival; a failure here is a codec bug.
    for (const absl::Status& st : {s, s2}) {
      if (!st.ok()) {
        std::fprintf(stderr, "pserver: decode of a validated push failed: %s\n",
                     std::string(st.message()).c_str());
      }
    }
    next_ += pair ? 2 : 1;
    contributors_ += pair ? 2 : 1;
    if (pair) ++paired_sums_;
  }
  draining_ = false;
  if (next_ == w_count) {
    if (contributors_ > 0) return CompleteRound();
    next_ = 0;  // every worker was dropped: wait for one to come back
  }
  return {};
}

std::vector<Shard::Ready> Shard::CompleteRound() {
  const uint64_t n = range_.size();
  // The mean over the workers that contributed (all of them unless some
  // were dropped for an expired lease).
  const float inv_w = 1.0f / static_cast<float>(contributors_);
  ParallelChunks(n, [&](uint64_t b, uint64_t e) {
    for (uint64_t i = b; i < e; ++i) acc_[i] *= inv_w;
  });
  absl::Time start = absl::Now();
  double update_norm = optimizer_->Step(acc_, absl::MakeSpan(x_));
  if (metrics_) metrics_->ObserveOptimizer(SecondsSince(start));
  ++step_;

  // Downlink: the replica follows x through the pull codec.
  start = absl::Now();
  prev_replica_checksum_ = replica_checksum_;
  double residual_norm = 0;
  if (config_.pull_codec == v1::CODEC_FP32) {
    x_hat_ = x_;
    delta_.reset();
  } else {
    // acc_ is free now: reuse it for x - x_hat.
    const float* x = x_.data();
    const float* x_hat = x_hat_.data();
    ParallelChunks(n, [&](uint64_t b, uint64_t e) {
      for (uint64_t i = b; i < e; ++i) acc_[i] = x[i] - x_hat[i];
    });
    v1::EncodedTensor d;
    absl::Status s = pull_codec_->Encode(
        acc_, PullSeed(config_.shard_index, step_), &d);
    if (s.ok()) {
      s = pull_codec_->DecodeAccumulate(d, 1.0f, absl::MakeSpan(x_hat_));
    }
    if (s.ok()) {
      delta_ = std::move(d);
    } else {
      // Non-finite weights (a diverged run): pulls fall back to snapshots.
      std::fprintf(stderr, "pserver: shard %u step %lu: pull encode failed: %s\n",
                   config_.shard_index, static_cast<unsigned long>(step_),
                   std::string(s.message()).c_str());
      delta_.reset();
    }
    for (uint64_t i = 0; i < n; ++i) {
      double r = double{x_[i]} - x_hat_[i];
      residual_norm += r * r;
    }
    residual_norm = std::sqrt(residual_norm);
  }
  replica_checksum_ = ChecksumOf(x_hat_);
  if (metrics_) {
    metrics_->ObservePullEncode(SecondsSince(start));
    metrics_->ObserveRound(SecondsSince(round_start_));
    metrics_->SetStep(step_);
    metrics_->SetStage(optimizer_->stage());
    metrics_->SetNorms(update_norm, L2Norm(optimizer_->m()), residual_norm);
  }

  std::fill(acc_.begin(), acc_.end(), 0.0f);
  for (auto& p : pending_) p.reset();
  if (writer_ && step_ % config_.checkpoint_every == 0) {
    ShardState state = CaptureState();
    absl::MutexLock l(&writer_mu_);
    to_write_ = std::move(state);  // a newer state replaces an unwritten one
  }
  for (auto& c : pending_codec_) c.reset();
  received_ = 0;
  next_ = 0;
  contributors_ = 0;
  bool changed = false;
  for (uint32_t w = 0; w < config_.num_workers; ++w) {
    if (rejoin_[w]) {
      rejoin_[w] = false;
      live_[w] = true;
      last_seen_[w] = absl::Now();
      changed = true;
    }
  }
  if (changed) PublishLiveness();
  return WakeWaiters();
}

std::vector<Shard::Ready> Shard::WakeWaiters() {
  std::vector<Ready> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->request.step() <= step_) {
      absl::StatusOr<v1::PullResponse> answer = AnswerPull(it->request);
      PullDone done = std::move(it->done);
      // mutable: the response (a whole snapshot, possibly) is moved, not
      // copied, into the callback.
      ready.push_back([done = std::move(done),
                       answer = std::move(answer)]() mutable {
        if (answer.ok()) {
          done(absl::OkStatus(), *std::move(answer));
        } else {
          done(answer.status(), v1::PullResponse());
        }
      });
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

absl::StatusOr<v1::PullResponse> Shard::AnswerPull(
    const v1::PullRequest& req) {
  v1::PullResponse resp;
  resp.set_step(step_);
  resp.set_stage(optimizer_->stage());
  resp.set_replica_checksum(replica_checksum_);
  bool delta_ok = delta_.has_value() && !req.want_snapshot() &&
                  req.step() == step_ &&
                  req.replica_step() == static_cast<int64_t>(step_) - 1 &&
                  req.replica_checksum() == prev_replica_checksum_;
  if (delta_ok) {
    resp.set_kind(v1::PULL_KIND_DELTA);
    *resp.mutable_weights() = *delta_;
  } else {
    resp.set_kind(v1::PULL_KIND_SNAPSHOT);
    SetFp32(x_hat_, resp.mutable_weights());
  }
  if (metrics_) {
    metrics_->AddSent(CodecName(resp.weights().codec()),
                      resp.weights().payload().size(),
                      Fp32Bytes(resp.weights().num_elements()));
  }
  return resp;
}

uint64_t Shard::Pull(const v1::PullRequest& req, PullDone done) {
  absl::Status error;
  absl::StatusOr<v1::PullResponse> answer;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      error = absl::UnavailableError("shard is shutting down");
    } else if (!registered_) {
      error = absl::FailedPreconditionError(
          "no model is registered on this shard; call Register first");
      if (metrics_) metrics_->CountRejected("not_registered");
    } else if (absl::Status s = CheckWorker(req.worker_id(), "worker_id");
               !s.ok()) {
      error = s;
      if (metrics_) metrics_->CountRejected("unknown_worker");
    } else if (Touch(req.worker_id()), req.step() > step_ + 1) {
      error = absl::FailedPreconditionError(absl::StrCat(
          "step is ", req.step(), "; the shard is at step ", step_,
          ", so at most step ", step_ + 1, " can be pulled"));
      if (metrics_) metrics_->CountRejected("future_step");
    } else if (req.step() == step_ + 1 && live_[req.worker_id()] &&
               pending_[req.worker_id()] == nullptr &&
               last_pushed_[req.worker_id()] < static_cast<int64_t>(step_)) {
      // The round cannot complete without this worker's push: waiting would
      // deadlock. Happens when a restart lost the push.
      error = absl::FailedPreconditionError(absl::StrCat(
          "worker_id ", req.worker_id(), " has not pushed step ", step_,
          " to this shard; push it, then pull step ", req.step()));
      if (metrics_) metrics_->CountRejected("pull_before_push");
    } else if (req.step() == step_ + 1) {
      id = next_waiter_id_++;
      waiters_.push_back(Waiter{id, req, std::move(done)});
      return id;
    } else {
      answer = AnswerPull(req);
    }
  }
  if (!error.ok()) {
    done(error, v1::PullResponse());
  } else if (!answer.ok()) {
    done(answer.status(), v1::PullResponse());
  } else {
    done(absl::OkStatus(), *std::move(answer));
  }
  return 0;
}

void Shard::CancelPull(uint64_t id, absl::Status why) {
  PullDone done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->id == id) {
        done = std::move(it->done);
        waiters_.erase(it);
        break;
      }
    }
  }
  if (done) done(why, v1::PullResponse());
}

absl::StatusOr<v1::PullResponse> Shard::PullBlocking(const v1::PullRequest& req,
                                                     absl::Duration timeout) {
  struct Result {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    v1::PullResponse resp ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  uint64_t id = Pull(req, [result](absl::Status s, v1::PullResponse r) {
    absl::MutexLock l(&result->mu);
    result->status = std::move(s);
    result->resp = std::move(r);
    result->done = true;
  });
  absl::MutexLock l(&result->mu);
  auto is_done = [&result]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(result->mu) {
    return result->done;
  };
  if (!result->mu.AwaitWithTimeout(absl::Condition(&is_done), timeout)) {
    result->mu.Unlock();
    CancelPull(id, absl::DeadlineExceededError(absl::StrCat(
                       "step ", req.step(), " not ready within ",
                       absl::FormatDuration(timeout))));
    result->mu.Lock();
    result->mu.Await(absl::Condition(&is_done));
  }
  if (!result->status.ok()) return result->status;
  return std::move(result->resp);
}

absl::StatusOr<v1::GetFrozenVarianceResponse> Shard::GetFrozenVariance(
    const v1::GetFrozenVarianceRequest& req) {
  if (absl::Status s = CheckWorker(req.worker_id(), "worker_id"); !s.ok()) {
    if (metrics_) metrics_->CountRejected("unknown_worker");
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (!registered_) {
    return absl::FailedPreconditionError(
        "no model is registered on this shard; call Register first");
  }
  if (!optimizer_->frozen()) {
    if (config_.optimizer.kind != OptimizerKind::kOneBitAdam) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the optimizer is ", OptimizerName(config_.optimizer.kind),
          "; only onebit_adam freezes its variance"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "variance is frozen from step ", optimizer_->freeze_at(),
        "; the shard is at step ", step_));
  }
  v1::GetFrozenVarianceResponse resp;
  resp.set_freeze_step(optimizer_->freeze_at());
  resp.set_eps(config_.optimizer.eps);
  SetFp32(optimizer_->frozen_variance(), resp.mutable_variance());
  return resp;
}

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
  uint32_t count = 0;
  for (bool b : worker_registered_) count += b ? 1 : 0;
  r.set_workers_registered(count);
  r.set_pushes_pending(received_);
  uint32_t live = 0;
  for (bool b : live_) live += b ? 1 : 0;
  r.set_workers_live(live);
  if (registered_) {
    r.set_stage(optimizer_->stage());
    r.set_shard_begin(range_.begin);
    r.set_shard_end(range_.end);
    r.set_replica_checksum(replica_checksum_);
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

uint64_t Shard::StateChecksumLocked() {
  Checksum64 h;
  h.Update(&step_, sizeof(step_));
  h.Update(x_.data(), x_.size() * sizeof(float));
  h.Update(x_hat_.data(), x_hat_.size() * sizeof(float));
  if (optimizer_) {
    h.Update(optimizer_->m().data(), optimizer_->m().size() * sizeof(float));
    h.Update(optimizer_->v().data(), optimizer_->v().size() * sizeof(float));
  }
  h.Update(last_pushed_.data(), last_pushed_.size() * sizeof(int64_t));
  for (size_t w = 0; w < pending_.size(); ++w) {
    bool p = pending_[w] != nullptr;
    h.Update(&p, 1);
  }
  return h.Finish();
}

void Shard::Shutdown() {
  std::list<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    reaper_stop_ = true;
    waiters.swap(waiters_);
  }
  if (reaper_) {
    reaper_->join();
    reaper_.reset();
  }
  for (Waiter& w : waiters) {
    w.done(absl::UnavailableError("shard is shutting down"),
           v1::PullResponse());
  }
}

void Shard::InstallModel(const v1::ModelLayout& layout,
                         const std::vector<TensorSlot>& slots,
                         std::vector<float> x) {
  ShardRange range = ShardRangeFor(TotalElements(layout), config_.num_shards,
                                   config_.shard_index);
  // Tensor pieces inside this shard, for per-tensor optimizer rules.
  std::vector<LocalSegment> segments;
  for (const TensorSlot& t : slots) {
    uint64_t b = std::max(t.offset, range.begin);
    uint64_t e = std::min(t.offset + t.size, range.end);
    if (b < e) segments.push_back({b - range.begin, e - range.begin});
  }
  layout_ = layout;
  range_ = range;
  x_ = std::move(x);
  x_hat_ = x_;
  acc_.assign(range.size(), 0.0f);
  optimizer_ = std::make_unique<Optimizer>(config_.optimizer, range.size(),
                                           std::move(segments));
  replica_checksum_ = ChecksumOf(x_hat_);
  prev_replica_checksum_ = replica_checksum_;
  registered_ = true;
  // Every worker's lease starts now: the first rounds wait for all of them.
  last_seen_.assign(config_.num_workers, absl::Now());
  PublishLiveness();
  if (metrics_) {
    metrics_->SetModelElements(range.size());
    metrics_->SetStage(optimizer_->stage());
  }
}

void Shard::FastForward(uint64_t step) {
  uint64_t skipped = step - step_;
  std::fprintf(stderr,
               "pserver: shard %u skips from step %lu to %lu (a worker "
               "resumed there; %lu rounds of this shard are lost)\n",
               config_.shard_index, static_cast<unsigned long>(step_),
               static_cast<unsigned long>(step),
               static_cast<unsigned long>(skipped));
  step_ = step;
  optimizer_->FastForward(step);
  // Workers' replicas of this shard are not x_hat any more: snapshots only.
  delta_.reset();
  prev_replica_checksum_ = replica_checksum_;
  if (metrics_) {
    metrics_->AddSkippedRounds(skipped);
    metrics_->SetStep(step_);
    metrics_->SetStage(optimizer_->stage());
  }
}

ShardState Shard::CaptureState() {
  ShardState st;
  st.shard_index = config_.shard_index;
  st.num_shards = config_.num_shards;
  st.num_workers = config_.num_workers;
  st.optimizer_kind = static_cast<uint32_t>(config_.optimizer.kind);
  st.frozen = optimizer_->frozen();
  st.preconditioned = config_.optimizer.preconditioned;
  st.step = step_;
  st.freeze_step = optimizer_->freeze_at();
  st.prev_replica_checksum = prev_replica_checksum_;
  st.replica_checksum = replica_checksum_;
  st.layout = layout_;
  st.delta = delta_;
  st.x = x_;
  st.m.assign(optimizer_->m().begin(), optimizer_->m().end());
  st.v.assign(optimizer_->v().begin(), optimizer_->v().end());
  st.x_hat = x_hat_;
  st.last_pushed = last_pushed_;
  return st;
}

absl::Status Shard::RestoreFrom(ShardState st) {
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(st.layout);
  if (!slots.ok()) return slots.status();
  if (ChecksumOf(st.x_hat) != st.replica_checksum) {
    return absl::DataLossError(
        "checkpoint replica does not match its recorded checksum");
  }
  absl::MutexLock lock(&mu_);
  InstallModel(st.layout, *slots, std::move(st.x));
  x_hat_ = std::move(st.x_hat);
  optimizer_->RestoreState(st.step, st.frozen, std::move(st.m),
                           std::move(st.v));
  step_ = st.step;
  last_pushed_ = std::move(st.last_pushed);
  delta_ = std::move(st.delta);
  replica_checksum_ = st.replica_checksum;
  prev_replica_checksum_ = st.prev_replica_checksum;
  // Workers registered before the restart may push straight away.
  worker_registered_.assign(config_.num_workers, true);
  if (metrics_) {
    metrics_->SetStep(step_);
    metrics_->SetStage(optimizer_->stage());
    metrics_->SetWorkersRegistered(config_.num_workers);
  }
  return absl::OkStatus();
}

absl::Status Shard::SaveCheckpoint() {
  if (config_.checkpoint_dir.empty()) {
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
  absl::MutexLock disk(&disk_mu_);
  absl::Time start = absl::Now();
  absl::Status s = WriteCheckpoint(config_.checkpoint_dir, state);
  if (metrics_) metrics_->ObserveCheckpoint(s.ok(), SecondsSince(start));
  return s;
}

void Shard::WriterLoop() {
  while (true) {
    std::optional<ShardState> state;
    {
      absl::MutexLock l(&writer_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(writer_mu_) {
        return to_write_.has_value() || writer_stop_;
      };
      writer_mu_.Await(absl::Condition(&ready));
      if (!to_write_.has_value()) return;  // stopping, nothing left
      state = std::move(to_write_);
      to_write_.reset();
    }
    absl::MutexLock disk(&disk_mu_);
    absl::Time start = absl::Now();
    absl::Status s = WriteCheckpoint(config_.checkpoint_dir, *state);
    if (metrics_) metrics_->ObserveCheckpoint(s.ok(), SecondsSince(start));
    if (!s.ok()) {
      std::fprintf(stderr, "pserver: shard %u: checkpoint failed: %s\n",
                   config_.shard_index, std::string(s.message()).c_str());
    }
  }
}

absl::Status Shard::Close() {
  if (writer_) {
    {
      absl::MutexLock l(&writer_mu_);
      writer_stop_ = true;
    }
    writer_->join();
    writer_.reset();
  }
  if (config_.checkpoint_dir.empty() || !registered()) return absl::OkStatus();
  return SaveCheckpoint();
}

Shard::~Shard() {
  {
    absl::MutexLock lock(&mu_);
    reaper_stop_ = true;
  }
  if (reaper_) reaper_->join();
  if (writer_) {
    {
      absl::MutexLock l(&writer_mu_);
      writer_stop_ = true;
    }
    writer_->join();
  }
}

void Shard::Touch(uint32_t worker) { last_seen_[worker] = absl::Now(); }

void Shard::PublishLiveness() {
  if (metrics_ == nullptr) return;
  uint32_t n = 0;
  for (bool b : live_) n += b ? 1 : 0;
  metrics_->SetWorkersLive(n);
}

std::vector<Shard::Ready> Shard::ReapLeases(absl::Time now) {
  if (!registered_ || config_.lease_timeout <= absl::ZeroDuration()) return {};
  std::vector<bool> waiting(config_.num_workers, false);
  for (const Waiter& w : waiters_) {
    if (w.request.worker_id() < waiting.size()) waiting[w.request.worker_id()] = true;
  }
  bool dropped = false;
  for (uint32_t w = 0; w < config_.num_workers; ++w) {
    if (!live_[w]) continue;
    bool pushed = pending_[w] != nullptr || next_ > w;
    if (pushed || waiting[w]) {
      last_seen_[w] = now;  // waiting on the round counts as alive
      continue;
    }
    if (now - last_seen_[w] > config_.lease_timeout) {
      live_[w] = false;
      dropped = true;
      std::fprintf(stderr,
                   "pserver: shard %u: worker %u dropped at step %lu (no call "
                   "for %s); the rounds go on without it\n",
                   config_.shard_index, w, static_cast<unsigned long>(step_),
                   absl::FormatDuration(now - last_seen_[w]).c_str());
      if (metrics_) metrics_->AddDroppedWorker();
    }
  }
  if (!dropped) return {};
  PublishLiveness();
  return Drain();
}

void Shard::ReaperLoop() {
  const absl::Duration period =
      std::min(absl::Seconds(1), config_.lease_timeout / 4);
  while (true) {
    std::vector<Ready> ready;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return reaper_stop_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&stop), period);
      if (reaper_stop_) return;
      ready = ReapLeases(absl::Now());
    }
    for (Ready& r : ready) r();
  }
}

}  // namespace pserver
