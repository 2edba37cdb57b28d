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
#include "common/unchanged.h"
#include "common/rejection.h"
#include "common/validated_tensor.h"

namespace pserver {

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options, prometheus::Registry* registry) {
  if (options.server_addresses.empty()) {
    return absl::InvalidArgumentError(
        "server_addresses is empty; expected one address per shard");
  }
  if (options.num_workers == 0 || options.worker_id >= options.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker_id is ", options.worker_id, " with num_workers ",
        options.num_workers, "; expected 0 <= worker_id < num_workers"));
  }
  for (const auto& [codec, params, name] :
       {std::tuple{options.push_codec, options.push_params, "push_codec"},
        std::tuple{options.warmup_codec, options.warmup_params,
                   "warmup_codec"}}) {
    // An unspecified push codec is the job's, known at Register.
    if (codec == v1::CODEC_UNSPECIFIED &&
        absl::string_view(name) == "push_codec") {
      continue;
    }
    absl::StatusOr<std::unique_ptr<Codec>> c = MakeCodec(codec, params);
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", c.status().message()));
    }
  }
  return std::unique_ptr<Client>(new Client(options, registry));
}

Client::Client(const ClientOptions& options, prometheus::Registry* registry)
    : options_(options), metrics_(registry) {
  metrics_.SetLog(options.log);
  ShardCallOptions o;
  o.addresses = options.server_addresses;
  o.security = options.security;
  o.max_message_bytes = options.max_message_bytes;
  o.rpc_timeout = options.rpc_timeout;
  o.pull_timeout = options.pull_timeout;
  o.retry_budget = options.retry_budget;
  calls_ = ShardCalls::Create(o, &metrics_);
}

Client::~Client() {
  if (pusher_.joinable()) {
    // A step abandoned midway: the push thread gets every chunk and ends
    // its calls at once (CANCELLED), rather than retrying shards that do
    // not answer for the retry budget. The shards treat this worker as one
    // that stopped: its lease runs out.
    calls_->Abandon();
    // Unchecked ranges: no bound is known for them (the encoder finds its
    // own, and refuses what is not finite).
    NoteGradientBound(std::numeric_limits<double>::infinity());
    for (const auto& [b, e] : ready_.Missing()) (void)ready_.Mark(b, e);
    pusher_.join();
  }
}

v1::RegisterRequest Client::RegisterRequestFor(size_t s,
                                               uint64_t resume_step) const {
  v1::RegisterRequest r;
  r.set_worker_id(options_.worker_id);
  r.set_num_workers(options_.num_workers);
  r.set_shard_index(static_cast<uint32_t>(s));
  r.set_num_shards(static_cast<uint32_t>(calls_->size()));
  *r.mutable_layout() = layout_;
  r.set_resume_step(resume_step);
  r.set_local_steps(options_.local_steps);
  r.set_push_codec(options_.push_codec);
  if (options_.beta1) r.mutable_adam_hyper()->set_beta1(*options_.beta1);
  if (options_.beta2) r.mutable_adam_hyper()->set_beta2(*options_.beta2);
  if (options_.eps) r.mutable_adam_hyper()->set_eps(*options_.eps);
  if (options_.schedule != nullptr) {
    r.set_schedule_fingerprint(options_.schedule->fingerprint());
  }
  r.set_total_steps(run_length_);
  r.set_chunked_weights(true);
  return r;
}

absl::Status Client::SendWeights(
    const std::vector<size_t>& shards,
    absl::FunctionRef<absl::Span<const float>(size_t)> slice,
    uint64_t resume_step, std::vector<v1::RegisterResponse>* resps) {
  std::vector<size_t> todo;
  std::vector<uint32_t> chunks;
  std::vector<ChunkPlan> plan(calls_->size());
  for (size_t s : shards) {
    const v1::RegisterResponse& r = (*resps)[s];
    if (r.model_ready()) continue;
    absl::StatusOr<uint64_t> c = AnnouncedChunking(s, r);
    if (!c.ok()) return c.status();
    plan[s] = ChunkPlan{slice(s).size(), *c};
    todo.push_back(s);
    chunks.push_back(plan[s].num_chunks());
  }
  if (todo.empty()) return absl::OkStatus();
  std::vector<bool> ready(calls_->size(), false);
  std::vector<absl::Status> sent = calls_->RegisterChunks(
      todo, chunks,
      [&](size_t s, uint32_t c, v1::RegisterRequest* req) {
        *req = RegisterRequestFor(s, resume_step);
        SetFp32(slice(s).subspan(plan[s].begin(c), plan[s].size(c)),
                req->mutable_initial_weights());
        req->set_weights_chunk(c);
        return absl::OkStatus();
      },
      [&](size_t s, uint32_t, const v1::RegisterResponse& resp) {
        if (resp.model_ready()) {
          (*resps)[s] = resp;
          ready[s] = true;
        }
        return absl::OkStatus();
      });
  for (size_t i = 0; i < todo.size(); ++i) {
    if (!sent[i].ok()) return sent[i];
    if (!ready[todo[i]]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", todo[i], " (", calls_->address(todo[i]),
          ") did not take the model after all ", chunks[i],
          " weight chunks (another worker took the installation over?)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Client::Register(const v1::ModelLayout& layout,
                              absl::Span<const float> initial_weights) {
  // A shard may move while this worker registers: another worker installs
  // a saved state (InstallShardStates) shard by shard, so for a while some
  // shards hold the state's step and others step 0. RegisterOnce then sets
  // moved_ and this waits (up to retry_budget) for the shards to agree,
  // registering again; ABORTED (a shard moving between Register and pull)
  // is tried a few times. A real misconfiguration fails at once.
  constexpr int kAbortedAttempts = 4;
  const absl::Time deadline = absl::Now() + options_.retry_budget;
  bool noted = false;
  int aborted = 0;
  for (;;) {
    moved_ = false;
    absl::Status st = RegisterOnce(layout, initial_weights);
    if (st.ok()) return st;
    if (moved_) {
      if (absl::Now() >= deadline) {
        return absl::Status(
            st.code(), absl::StrCat(st.message(), "; still so after ",
                                    absl::FormatDuration(options_.retry_budget),
                                    " (retry_budget)"));
      }
      if (!noted) {
        metrics_.Note(absl::StrCat(st.message(), "; waiting up to ",
                                   absl::FormatDuration(options_.retry_budget),
                                   " for the shards to agree"));
        noted = true;
      }
      absl::SleepFor(absl::Milliseconds(200));
    } else if (absl::IsAborted(st) && ++aborted < kAbortedAttempts) {
      absl::SleepFor(absl::Milliseconds(200) * aborted);
    } else {
      return st;
    }
  }
}

absl::Status Client::RegisterOnce(const v1::ModelLayout& layout,
                                  absl::Span<const float> initial_weights) {
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(layout);
  if (!slots.ok()) return slots.status();
  if (options_.schedule != nullptr) {
    if (absl::Status st = options_.schedule->CheckTensors(*slots); !st.ok()) {
      return st;
    }
  }
  const uint64_t total = TotalElements(layout);
  if (initial_weights.size() != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_weights has ", initial_weights.size(),
        " elements; the layout has ", total));
  }
  registered_ = false;
  layout_ = layout;
  slots_ = *slots;
  const size_t n = calls_->size();
  std::vector<ShardRange> ranges(n);
  std::vector<v1::RegisterResponse> resps(n);
  if (absl::Status st = AwaitLostModels(); !st.ok()) return st;
  {
    // Join every shard; a shard without a model makes this worker its
    // installer, and then gets the weights chunk by chunk.
    std::vector<v1::RegisterRequest> reqs(n);
    std::vector<size_t> all(n);
    for (size_t s = 0; s < n; ++s) {
      all[s] = s;
      ranges[s] = ShardRangeFor(total, static_cast<uint32_t>(n),
                                static_cast<uint32_t>(s));
      reqs[s] = RegisterRequestFor(s, 0);
    }
    // Shards another worker is installing are asked again only after this
    // worker has installed the shards it got first: two workers each
    // installing one shard must not wait for each other.
    std::vector<size_t> busy;
    std::vector<size_t> joined;
    std::vector<absl::Status> first =
        calls_->Register(all, reqs, &resps, /*retry_busy=*/false);
    for (size_t s = 0; s < n; ++s) {
      if (first[s].ok()) {
        joined.push_back(s);
      } else if (ReasonOf(first[s]) == v1::REJECT_REASON_BUSY) {
        busy.push_back(s);
      } else {
        return first[s];
      }
    }
    auto slice = [&](size_t s) {
      return initial_weights.subspan(ranges[s].begin, ranges[s].size());
    };
    if (absl::Status st = SendWeights(joined, slice, 0, &resps); !st.ok()) {
      return st;
    }
    if (!busy.empty()) {
      for (absl::Status& st : calls_->Register(busy, reqs, &resps)) {
        if (!st.ok()) return st;
      }
      // The installer went silent and this worker took over.
      if (absl::Status st = SendWeights(busy, slice, 0, &resps); !st.ok()) {
        return st;
      }
    }
  }
  // A previous incarnation of this worker may have crashed after its push
  // reached only some shards: those completed the round without it and are
  // one step ahead. Start from the lagging shards' step; the next push to an
  // ahead shard is acknowledged as a duplicate. Further apart only when a
  // shard restarted from a checkpoint behind the others: it skips ahead.
  if (absl::Status st = CatchUpLaggingShards(&resps); !st.ok()) return st;
  uint64_t min_step = resps[0].current_step();
  uint64_t max_step = min_step;
  for (const v1::RegisterResponse& r : resps) {
    min_step = std::min<uint64_t>(min_step, r.current_step());
    max_step = std::max<uint64_t>(max_step, r.current_step());
  }
  plans_.assign(n, ChunkPlan());
  sent_.assign(n, {});
  sent_space_.assign(n, v1::GRADIENT_SPACE_RAW);
  sent_momentum_.assign(n, 0);
  for (size_t s = 0; s < n; ++s) {
    const v1::RegisterResponse& r = resps[s];
    if (r.shard_begin() != ranges[s].begin || r.shard_end() != ranges[s].end) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " owns [", r.shard_begin(), ", ", r.shard_end(),
          "); expected [", ranges[s].begin, ", ", ranges[s].end, ")"));
    }
    plans_[s].n = ranges[s].size();
    if (absl::Status st = SetChunking(s, r); !st.ok()) return st;
  }
  consistency_ = resps[0].consistency() == v1::CONSISTENCY_UNSPECIFIED
                     ? v1::CONSISTENCY_BSP
                     : resps[0].consistency();
  for (size_t s = 1; s < n; ++s) {
    v1::Consistency c = resps[s].consistency() == v1::CONSISTENCY_UNSPECIFIED
                            ? v1::CONSISTENCY_BSP
                            : resps[s].consistency();
    if (c != consistency_ ||
        resps[s].max_staleness() != resps[0].max_staleness()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " runs consistency ", v1::Consistency_Name(c),
          " (max_staleness ", resps[s].max_staleness(), ") and shard 0 ",
          v1::Consistency_Name(consistency_), " (max_staleness ",
          resps[0].max_staleness(),
          "); expected the same --consistency and --max_staleness on every "
          "shard"));
    }
  }
  // Under ssp and async the shards' steps are their own.
  if (!relaxed() && max_step > min_step + 1) {
    moved_ = true;  // or a state being installed shard by shard: waited for
    return absl::FailedPreconditionError(
        absl::StrCat("shards are more than one step apart: their steps range "
                     "from ", min_step, " to ", max_step));
  }
  const bool freezes = resps[0].freeze_step() > 0;
  const v1::GradientSpace space = resps[0].compression_space();
  const float momentum = resps[0].worker_momentum();
  for (size_t s = 1; s < n; ++s) {
    if (resps[s].worker_momentum() != momentum) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " announces worker_momentum ",
          resps[s].worker_momentum(), " and shard 0 ", momentum,
          "; expected the same --onebit_momentum, --beta1 and "
          "--compression_beta1 on every shard"));
    }
  }
  PushCodecs codecs;
  // The worker's own choice, else the job's (shards before the field
  // announce none: onebit, the client's old default).
  codecs.push = options_.push_codec != v1::CODEC_UNSPECIFIED
                    ? options_.push_codec
                : resps[0].push_codec() != v1::CODEC_UNSPECIFIED
                    ? resps[0].push_codec()
                    : v1::CODEC_ONEBIT;
  if (absl::Status st = MakeCodec(codecs.push, options_.push_params).status();
      !st.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job's push codec ", CodecName(codecs.push), " (",
        resps[0].push_codec_source(), "): ", st.message()));
  }
  push_codec_ = codecs.push;
  codecs.push_params = options_.push_params;
  codecs.warmup = options_.warmup_codec;
  codecs.warmup_params = options_.warmup_params;
  codecs.ef_decay = options_.ef_decay;
  codecs.momentum_masking = options_.momentum_masking;
  encoders_.clear();
  tensor_plan_phase_.assign(n, -1);
  replica_.Reset(total, std::move(ranges), min_step);
  for (size_t s = 0; s < n; ++s) {
    absl::StatusOr<std::unique_ptr<PushEncoder>> e =
        PushEncoder::Create(codecs, replica_.range(s).size(), freezes, space,
                            momentum);
    if (!e.ok()) return e.status();
    // Buffers are pushed as they are: no preconditioner, no momentum.
    (*e)->SetRawRanges(BufferRanges(slots_, replica_.range(s)));
    encoders_.push_back(*std::move(e));
    if (absl::Status st = SetPhase(s, resps[s].schedule_phase()); !st.ok()) {
      return st;
    }
  }
  // The replica starts as this worker's initial weights. A shard at
  // min_step whose x_hat is the same (the installer's weights, and this
  // worker's were made the same way, e.g. from one seed) answers with
  // nothing; any other sends its snapshot.
  replica_.Assume(initial_weights);
  std::vector<bool> snapshot(n);
  for (size_t s = 0; s < n; ++s) {
    snapshot[s] = resps[s].current_step() != min_step;
  }
  if (absl::Status st = PullAll(min_step, std::move(snapshot), /*push=*/nullptr);
      !st.ok()) {
    return st;
  }
  // An initial snapshot's staging copy: a run whose pulls are compressed
  // deltas never needs it again, one with fp32 pulls takes it back at its
  // first pull (worker/replica.h).
  replica_.ReleaseStaging();
  settings_ = resps[0].optimizer_settings();
  if (hyper_.size() != 0 && hyper_.size() != GroupCount(layout_)) {
    hyper_.Clear();  // set for another layout
  }
  registered_ = true;
  return absl::OkStatus();
}

absl::Status Client::SetHyper(std::vector<v1::HyperParams> hyper) {
  if (!registered_) {
    return absl::FailedPreconditionError(
        "SetHyper before Register; register first (the layout names the "
        "groups)");
  }
  if (in_step()) {
    return absl::FailedPreconditionError(
        "SetHyper during a step; call it before Step or StartStep");
  }
  google::protobuf::RepeatedPtrField<v1::HyperParams> values(
      std::make_move_iterator(hyper.begin()),
      std::make_move_iterator(hyper.end()));
  if (absl::Status s = ValidateHyperParams(values, GroupCount(layout_));
      !s.ok()) {
    return s;
  }
  hyper_ = std::move(values);
  return absl::OkStatus();
}

v1::OptimizerStage Client::stage() const {
  for (const auto& e : encoders_) {
    if (e->stage() != v1::OPTIMIZER_STAGE_COMPRESSION) {
      return v1::OPTIMIZER_STAGE_WARMUP;
    }
  }
  return v1::OPTIMIZER_STAGE_COMPRESSION;
}

absl::StatusOr<uint64_t> Client::AnnouncedChunking(
    size_t s, const v1::RegisterResponse& resp) const {
  const uint64_t c = resp.chunk_elements();
  if (c < kMinChunkElements || c > kMaxChunkElements) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", s, " (", calls_->address(s), ") announced chunk_elements ",
        c, "; expected ", kMinChunkElements, "..", kMaxChunkElements,
        " (a shard of another pserver version?)"));
  }
  return c;
}

absl::Status Client::SetChunking(size_t s, const v1::RegisterResponse& resp) {
  absl::StatusOr<uint64_t> c = AnnouncedChunking(s, resp);
  if (!c.ok()) return c.status();
  plans_[s].chunk_elements = *c;
  return absl::OkStatus();
}

double Client::ResidualNorm() const {
  double sq = 0;
  for (const auto& e : encoders_) {
    for (const ErrorFeedback* ef : {&e->warmup_ef(), &e->push_ef()}) {
      const double norm = ef->ResidualNorm();
      sq += norm * norm;
    }
  }
  return std::sqrt(sq);
}

}  // namespace pserver
