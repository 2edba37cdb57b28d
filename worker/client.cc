#include "worker/client.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/fp32_tensor.h"
#include "common/mix.h"
#include "common/rejection.h"

namespace pserver {
namespace {

// Whether no value is NaN or infinite: an exponent of all ones. A branch-
// free loop the compiler vectorizes (std::isfinite per element is not).
bool AllFinite(absl::Span<const float> v) {
  uint32_t bad = 0;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  return bad == 0;
}

}  // namespace

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
  ShardCallOptions o;
  o.addresses = options.server_addresses;
  o.security = options.security;
  o.max_message_bytes = options.max_message_bytes;
  o.rpc_timeout = options.rpc_timeout;
  o.pull_timeout = options.pull_timeout;
  o.retry_budget = options.retry_budget;
  calls_ = ShardCalls::Create(o, &metrics_);
}

Client::~Client() = default;

v1::RegisterRequest Client::RegisterRequestFor(size_t s,
                                               uint64_t resume_step) const {
  v1::RegisterRequest r;
  r.set_worker_id(options_.worker_id);
  r.set_num_workers(options_.num_workers);
  r.set_shard_index(static_cast<uint32_t>(s));
  r.set_num_shards(static_cast<uint32_t>(calls_->size()));
  *r.mutable_layout() = layout_;
  r.set_resume_step(resume_step);
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
    const uint64_t c = r.chunk_elements();
    if (c < kMinChunkElements || c > kMaxChunkElements) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " (", calls_->address(s), ") announced chunk_elements ",
          c, "; expected ", kMinChunkElements, "..", kMaxChunkElements));
    }
    plan[s] = ChunkPlan{slice(s).size(), c};
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
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(layout);
  if (!slots.ok()) return slots.status();
  const uint64_t total = TotalElements(layout);
  if (initial_weights.size() != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_weights has ", initial_weights.size(),
        " elements; the layout has ", total));
  }
  registered_ = false;
  layout_ = layout;
  const size_t n = calls_->size();
  std::vector<ShardRange> ranges(n);
  std::vector<v1::RegisterResponse> resps(n);
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
  // ahead shard is acknowledged as a duplicate. Further apart cannot happen
  // in a synchronous run.
  uint64_t min_step = resps[0].current_step();
  uint64_t max_step = min_step;
  for (const v1::RegisterResponse& r : resps) {
    min_step = std::min<uint64_t>(min_step, r.current_step());
    max_step = std::max<uint64_t>(max_step, r.current_step());
  }
  plans_.assign(n, ChunkPlan());
  sent_.assign(n, {});
  sent_space_.assign(n, v1::GRADIENT_SPACE_RAW);
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
  if (max_step > min_step + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("shards are more than one step apart: their steps range "
                     "from ", min_step, " to ", max_step));
  }
  const bool freezes = resps[0].freeze_step() > 0;
  const v1::GradientSpace space = resps[0].compression_space();
  PushCodecs codecs;
  codecs.push = options_.push_codec;
  codecs.push_params = options_.push_params;
  codecs.warmup = options_.warmup_codec;
  codecs.warmup_params = options_.warmup_params;
  codecs.ef_decay = options_.ef_decay;
  encoders_.clear();
  for (size_t s = 0; s < n; ++s) {
    absl::StatusOr<std::unique_ptr<PushEncoder>> e =
        PushEncoder::Create(codecs, ranges[s].size(), freezes, space);
    if (!e.ok()) return e.status();
    encoders_.push_back(*std::move(e));
  }
  replica_.Reset(total, std::move(ranges), min_step);
  if (absl::Status st =
          PullAll(min_step, std::vector<bool>(n, true), /*push=*/nullptr);
      !st.ok()) {
    return st;
  }
  registered_ = true;
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

absl::Status Client::SetChunking(size_t s, const v1::RegisterResponse& resp) {
  const uint64_t c = resp.chunk_elements();
  if (c < kMinChunkElements || c > kMaxChunkElements) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", s, " (", calls_->address(s), ") announced chunk_elements ",
        c, "; expected ", kMinChunkElements, "..", kMaxChunkElements,
        " (a shard of another pserver version?)"));
  }
  plans_[s].chunk_elements = c;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Client::Rejoin(size_t s, uint64_t resume_step) {
  v1::RegisterRequest req = RegisterRequestFor(s, resume_step);
  std::vector<v1::RegisterResponse> resps(calls_->size());
  if (absl::Status st = calls_->Register(s, req, &resps[s]); !st.ok()) {
    return st;
  }
  // A shard that lost its model takes this worker's replica as weights.
  if (absl::Status st = SendWeights(
          {s}, [&](size_t) { return replica_.slice(s); }, resume_step, &resps);
      !st.ok()) {
    return st;
  }
  const v1::RegisterResponse& resp = resps[s];
  if (absl::Status st = SetChunking(s, resp); !st.ok()) return st;
  metrics_.CountRejoin();
  if (absl::Status st = SetStage(s, resp.stage()); !st.ok()) return st;
  return resp.current_step();
}

absl::StatusOr<std::optional<Preconditioner>> Client::PrepareStage(
    size_t s, v1::OptimizerStage stage) {
  PushEncoder& e = *encoders_[s];
  if (stage == e.stage() || stage != v1::OPTIMIZER_STAGE_COMPRESSION ||
      !e.needs_preconditioner()) {
    return std::optional<Preconditioner>();
  }
  v1::GetFrozenVarianceRequest req;
  req.set_worker_id(options_.worker_id);
  v1::GetFrozenVarianceResponse resp;
  if (absl::Status st = calls_->GetFrozenVariance(s, req, &resp); !st.ok()) {
    return st;
  }
  absl::StatusOr<Preconditioner> d =
      Preconditioner::FromFrozenVariance(resp, replica_.range(s).size());
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

absl::Status Client::EncodeChunk(size_t s, uint32_t c,
                                 absl::Span<const float> gradient,
                                 v1::PushRequest* req) {
  const ShardRange& r = replica_.range(s);
  const ChunkPlan& plan = plans_[s];
  const uint64_t step = replica_.step();
  req->set_worker_id(options_.worker_id);
  req->set_step(step);
  req->set_chunk(c);
  uint64_t seed = MixPair(MixPair(options_.seed, options_.worker_id),
                          MixPair(step, s));
  if (c > 0) seed = MixPair(seed, c);
  absl::Status st = encoders_[s]->EncodeChunk(
      gradient.subspan(r.begin + plan.begin(c), plan.size(c)), plan.begin(c),
      seed, req);
  if (!st.ok()) return st;
  std::vector<v1::EncodedTensor>& kept = sent_[s];
  if (kept.size() != plan.num_chunks()) kept.resize(plan.num_chunks());
  if (req->gradient().codec() != v1::CODEC_FP32) {
    kept[c] = req->gradient();
  } else {
    kept[c].Clear();
  }
  sent_space_[s] = req->space();
  return absl::OkStatus();
}

absl::Status Client::Step(absl::Span<const float> gradient) {
  if (!registered_) {
    return absl::FailedPreconditionError("Step() before Register()");
  }
  if (gradient.size() != num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient has ", gradient.size(), " elements; expected ",
                     num_params()));
  }
  if (!AllFinite(gradient)) {
    for (size_t i = 0; i < gradient.size(); ++i) {
      if (!std::isfinite(gradient[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gradient[", i, "] is ", gradient[i], "; expected a finite value"));
      }
    }
  }
  const size_t n = calls_->size();
  std::vector<size_t> all(n);
  std::vector<uint32_t> chunks(n);
  for (size_t s = 0; s < n; ++s) {
    all[s] = s;
    chunks[s] = plans_[s].num_chunks();
  }
  // Chunks are encoded just before they are sent, while earlier chunks are
  // on the wire: the encode time is counted apart from the push time.
  absl::Duration encoding;
  const absl::Time start = absl::Now();
  std::vector<absl::Status> pushed = calls_->PushChunks(
      all, chunks,
      [&](size_t s, uint32_t c, v1::PushRequest* req) {
        const absl::Time t = absl::Now();
        absl::Status st = EncodeChunk(s, c, gradient, req);
        encoding += absl::Now() - t;
        if (st.ok()) {
          metrics_.CountPush(req->gradient().payload().size(),
                             Fp32Bytes(plans_[s].size(c)));
        }
        return st;
      },
      [](size_t, uint32_t, const v1::PushResponse&) {
        return absl::OkStatus();
      });
  const PendingPush push{gradient};
  std::vector<bool> snapshot(n, false);
  for (size_t s = 0; s < n; ++s) {
    if (pushed[s].ok()) continue;
    const Recovery r = RecoveryFor(pushed[s]);
    if (r == Recovery::kFail) return pushed[s];
    if (absl::Status st = Recover(s, r, push); !st.ok()) return st;
    snapshot[s] = true;  // its replica is not ours any more
  }
  metrics_.AddEncodeSeconds(absl::ToDoubleSeconds(encoding));
  metrics_.AddPushSeconds(absl::ToDoubleSeconds(absl::Now() - start - encoding));
  const absl::Time pull_start = absl::Now();
  absl::Status st = PullAll(replica_.step() + 1, std::move(snapshot), &push);
  metrics_.AddPullSeconds(absl::ToDoubleSeconds(absl::Now() - pull_start));
  if (!st.ok()) return st;
  metrics_.CountStep();
  return absl::OkStatus();
}

absl::Status Client::Recover(size_t s, Recovery recovery,
                             const PendingPush& push) {
  const uint64_t step = replica_.step();
  if (recovery == Recovery::kRejoinNextRound) {
    // This round went on without us on that shard: register again to be
    // counted from the next round, and take that round's weights.
    return Rejoin(s, 0).status();
  }
  // The shard is behind this step or lost this worker's registration (it
  // restarted): register again, letting it catch up to `step`.
  absl::StatusOr<uint64_t> now = Rejoin(s, step);
  if (!now.ok()) return now.status();
  // Another worker already brought the shard past this step: the round
  // this push was for is over (lost on that shard); just pull.
  if (*now > step) return absl::OkStatus();
  // The same chunks again. A shard that came back in warmup expects the
  // warmup codec in RAW space: then every chunk is encoded anew, as is an
  // fp32 chunk (not kept; the same bytes) or any chunk when the shard's
  // chunking changed.
  const bool reencode = sent_space_[s] != v1::GRADIENT_SPACE_RAW &&
                        encoders_[s]->stage() != v1::OPTIMIZER_STAGE_COMPRESSION;
  const uint32_t chunks = plans_[s].num_chunks();
  const std::vector<v1::EncodedTensor> kept =
      sent_[s].size() == chunks ? sent_[s] : std::vector<v1::EncodedTensor>();
  const v1::GradientSpace space = sent_space_[s];
  return calls_->PushChunks(
      {s}, {chunks},
      [&](size_t, uint32_t c, v1::PushRequest* req) {
        if (reencode || kept.empty() ||
            kept[c].codec() == v1::CODEC_UNSPECIFIED) {
          return EncodeChunk(s, c, push.gradient, req);
        }
        req->set_worker_id(options_.worker_id);
        req->set_step(step);
        req->set_chunk(c);
        req->set_space(space);
        *req->mutable_gradient() = kept[c];
        return absl::OkStatus();
      },
      [](size_t, uint32_t, const v1::PushResponse&) {
        return absl::OkStatus();
      })[0];
}

absl::Status Client::CheckAnswer(size_t s, uint64_t step, bool registering,
                                 const v1::PullResponse& resp,
                                 bool* ahead) const {
  // At Register a shard one step ahead (see Register) answers with its
  // newer snapshot.
  *ahead = registering && resp.kind() == v1::PULL_KIND_SNAPSHOT &&
           resp.step() == step + 1;
  if (resp.step() != step && !*ahead) {
    return absl::AbortedError(absl::StrCat(
        "shard ", s, " answered with step ", resp.step(), "; expected ", step));
  }
  return absl::OkStatus();
}

absl::Status Client::PullAll(uint64_t step, std::vector<bool> snapshot,
                             const PendingPush* push) {
  const size_t n = calls_->size();
  // What the first chunk of each shard's answer said; every other chunk
  // must agree (one step, one kind, one checksum).
  struct Head {
    bool seen = false;
    v1::PullKind kind = v1::PULL_KIND_UNSPECIFIED;
    uint64_t step = 0;
    uint64_t checksum = 0;
    v1::OptimizerStage stage = v1::OPTIMIZER_STAGE_UNSPECIFIED;
    bool ahead = false;
  };
  std::vector<Head> head(n);
  // The replica stages the decoded slices (worker/replica.h); nothing
  // changes unless every shard's answer verified.
  replica_.BeginUpdate();
  std::vector<size_t> todo(n);
  for (size_t s = 0; s < n; ++s) todo[s] = s;
  for (int attempt = 0; attempt < 4 && !todo.empty(); ++attempt) {
    std::vector<uint32_t> chunks;
    for (size_t s : todo) {
      chunks.push_back(plans_[s].num_chunks());
      head[s] = Head();
    }
    // A refusal no retry fixes, per shard (set by `finish`).
    std::vector<absl::Status> fatal(n);
    std::vector<absl::Status> pulled = calls_->PullChunks(
        todo, chunks,
        [&](size_t s, uint32_t c, v1::PullRequest* q) {
          q->Clear();
          q->set_worker_id(options_.worker_id);
          q->set_step(step);
          q->set_chunk(c);
          q->set_want_snapshot(snapshot[s]);
          if (!snapshot[s]) {
            q->set_replica_step(static_cast<int64_t>(replica_.step()));
            // Verified against the shard when the replica was last
            // committed.
            q->set_replica_checksum(replica_.checksum(s));
          } else {
            q->set_replica_step(-1);
          }
          return absl::OkStatus();
        },
        [&](size_t s, uint32_t c, const v1::PullResponse& resp) {
          bool is_ahead = false;
          if (absl::Status a = CheckAnswer(s, step, push == nullptr, resp,
                                           &is_ahead);
              !a.ok()) {
            fatal[s] = a;
            return a;
          }
          Head& h = head[s];
          if (!h.seen) {
            h = Head{true, resp.kind(), resp.step(), resp.replica_checksum(),
                     resp.stage(), is_ahead};
          } else if (resp.kind() != h.kind || resp.step() != h.step ||
                     resp.replica_checksum() != h.checksum) {
            // The shard moved on between chunks: take a snapshot.
            return absl::DataLossError(absl::StrCat(
                "shard ", s, "'s chunks answer different steps or kinds"));
          }
          const ChunkPlan& plan = plans_[s];
          if (resp.chunk() != c) {
            fatal[s] = absl::InvalidArgumentError(absl::StrCat(
                "pull from shard ", s, " (", calls_->address(s),
                "): answered chunk ", resp.chunk(), " for chunk ", c));
            return fatal[s];
          }
          metrics_.CountPull(resp.weights().payload().size(),
                             Fp32Bytes(plan.size(c)));
          if (c == 0 && resp.kind() == v1::PULL_KIND_SNAPSHOT) {
            metrics_.CountSnapshot();
          }
          if (absl::Status st =
                  replica_.StageChunk(s, plan.begin(c), plan.size(c), resp);
              !st.ok()) {
            fatal[s] = absl::Status(
                st.code(), absl::StrCat("pull from shard ", s, " (",
                                        calls_->address(s), ") chunk ", c,
                                        ": ", st.message()));
            return fatal[s];
          }
          return absl::OkStatus();
        });
    std::vector<size_t> again;
    for (size_t i = 0; i < todo.size(); ++i) {
      const size_t s = todo[i];
      if (!fatal[s].ok()) return fatal[s];
      if (absl::IsDataLoss(pulled[i])) {
        metrics_.CountChecksumMismatch();
        again.push_back(s);
        continue;
      }
      if (!pulled[i].ok()) {
        // At Register there is no push to resend: every refusal fails.
        const Recovery r =
            push == nullptr ? Recovery::kFail : RecoveryFor(pulled[i]);
        if (r == Recovery::kFail) return pulled[i];
        if (absl::Status st = Recover(s, r, *push); !st.ok()) return st;
        again.push_back(s);
        continue;
      }
      absl::Status st = replica_.FinishStage(s, head[s].checksum);
      if (absl::IsDataLoss(st)) {
        metrics_.CountChecksumMismatch();
        again.push_back(s);
      } else if (!st.ok()) {
        return st;
      }
    }
    todo = std::move(again);
    for (size_t s : todo) snapshot[s] = true;  // re-sync what did not verify
  }
  if (!todo.empty()) {
    return absl::DataLossError(absl::StrCat(
        "replica of shard ", todo[0], " does not match its checksum even "
        "after a snapshot"));
  }
  // Stage changes need the frozen preconditioner (an RPC that can fail):
  // fetched before anything is committed. An ahead shard may already be
  // past the freeze; the next push follows the lagging shards.
  std::vector<std::optional<Preconditioner>> d(n);
  for (size_t s = 0; s < n; ++s) {
    if (head[s].ahead) continue;
    absl::StatusOr<std::optional<Preconditioner>> p =
        PrepareStage(s, head[s].stage);
    if (!p.ok()) return p.status();
    d[s] = *std::move(p);
  }
  replica_.Commit(step);
  for (size_t s = 0; s < n; ++s) {
    if (head[s].ahead) continue;
    if (absl::Status st = encoders_[s]->SetStage(head[s].stage,
                                                 std::move(d[s]));
        !st.ok()) {
      return st;
    }
  }
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
