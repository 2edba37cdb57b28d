#include "worker/client.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace pserver {
namespace {

bool Retriable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ULL + b + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// One RPC per shard in `todo`, all in flight at once through the callback
// API; retriable failures are retried with backoff until `budget` is spent.
// `start(s, ctx, done)` issues shard s's call. Returns each shard's final
// status (indexed like `todo`), prefixed with the shard and its address.
std::vector<absl::Status> CallEach(
    const std::vector<size_t>& todo, absl::Duration attempt_timeout,
    absl::Duration budget, const std::vector<std::string>& addresses,
    const char* method, uint64_t* retries,
    const std::function<void(size_t, grpc::ClientContext*,
                             std::function<void(grpc::Status)>)>& start) {
  std::vector<absl::Status> out(todo.size());
  std::vector<size_t> pending(todo.size());  // indexes into todo
  for (size_t i = 0; i < todo.size(); ++i) pending[i] = i;
  absl::Time give_up = absl::Now() + budget;
  absl::Duration backoff = absl::Milliseconds(50);
  while (!pending.empty()) {
    std::vector<grpc::Status> result(pending.size());
    std::vector<std::unique_ptr<grpc::ClientContext>> ctx(pending.size());
    absl::BlockingCounter left(static_cast<int>(pending.size()));
    for (size_t i = 0; i < pending.size(); ++i) {
      ctx[i] = std::make_unique<grpc::ClientContext>();
      ctx[i]->set_deadline(absl::ToChronoTime(absl::Now() + attempt_timeout));
      // Wait for a shard that is (re)starting instead of failing at once.
      ctx[i]->set_wait_for_ready(true);
      start(todo[pending[i]], ctx[i].get(),
            [&result, &left, i](grpc::Status s) {
              result[i] = std::move(s);
              left.DecrementCount();
            });
    }
    left.Wait();
    std::vector<size_t> again;
    for (size_t i = 0; i < pending.size(); ++i) {
      const size_t shard = todo[pending[i]];
      if (result[i].ok()) {
        out[pending[i]] = absl::OkStatus();
      } else if (Retriable(result[i]) && absl::Now() < give_up) {
        again.push_back(pending[i]);
      } else {
        absl::Status st = FromGrpcStatus(result[i], *ctx[i]);
        absl::Status prefixed(
            st.code(), absl::StrCat(method, " to shard ", shard, " (",
                                    addresses[shard], "): ", st.message()));
        v1::RejectReason reason = ReasonOf(st);
        out[pending[i]] = reason == v1::REJECT_REASON_UNSPECIFIED
                              ? prefixed
                              : Reject(reason, std::move(prefixed));
      }
    }
    if (again.empty()) break;
    *retries += again.size();
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
    pending = std::move(again);
  }
  return out;
}

// CallEach, returning the first error.
absl::Status CallAll(
    const std::vector<size_t>& todo, absl::Duration attempt_timeout,
    absl::Duration budget, const std::vector<std::string>& addresses,
    const char* method, uint64_t* retries,
    const std::function<void(size_t, grpc::ClientContext*,
                             std::function<void(grpc::Status)>)>& start) {
  for (absl::Status& s : CallEach(todo, attempt_timeout, budget, addresses,
                                  method, retries, start)) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
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
  std::unique_ptr<Client> client(new Client(options));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  for (const std::string& address : options.server_addresses) {
    ShardState s;
    s.address = address;
    s.channel = grpc::CreateCustomChannel(
        address, MakeChannelCredentials(options.security), args);
    s.stub = v1::ParameterServer::NewStub(s.channel);
    client->shards_.push_back(std::move(s));
  }
  return client;
}

Client::Client(const ClientOptions& options) : options_(options) {}
Client::~Client() = default;

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
  const uint32_t num_shards = static_cast<uint32_t>(shards_.size());
  std::vector<v1::RegisterRequest> reqs(num_shards);
  std::vector<v1::RegisterResponse> resps(num_shards);
  std::vector<size_t> all;
  for (uint32_t s = 0; s < num_shards; ++s) {
    ShardState& sh = shards_[s];
    sh.range = ShardRangeFor(total, num_shards, s);
    // Codecs were checked in Connect().
    sh.warmup_codec =
        MakeCodec(options_.warmup_codec, options_.warmup_params).value();
    sh.push_codec = MakeCodec(options_.push_codec, options_.push_params).value();
    sh.warmup_ef = std::make_unique<ErrorFeedback>(
        sh.warmup_codec.get(), sh.range.size(), options_.ef_decay);
    sh.push_ef = std::make_unique<ErrorFeedback>(
        sh.push_codec.get(), sh.range.size(), options_.ef_decay);
    v1::RegisterRequest& r = reqs[s];
    r.set_worker_id(options_.worker_id);
    r.set_num_workers(options_.num_workers);
    r.set_shard_index(s);
    r.set_num_shards(num_shards);
    *r.mutable_layout() = layout;
    v1::EncodedTensor* w = r.mutable_initial_weights();
    w->set_codec(v1::CODEC_FP32);
    w->set_num_elements(sh.range.size());
    w->mutable_payload()->assign(
        reinterpret_cast<const char*>(initial_weights.data() + sh.range.begin),
        sh.range.size() * sizeof(float));
    all.push_back(s);
  }
  std::vector<std::string> addresses(options_.server_addresses);
  absl::Status st = CallAll(
      all, options_.rpc_timeout, options_.retry_budget, addresses, "Register",
      &stats_.retries,
      [&](size_t s, grpc::ClientContext* ctx,
          std::function<void(grpc::Status)> done) {
        shards_[s].stub->async()->Register(ctx, &reqs[s], &resps[s],
                                           std::move(done));
      });
  if (!st.ok()) return st;
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
  for (uint32_t s = 0; s < num_shards; ++s) {
    const v1::RegisterResponse& r = resps[s];
    if (r.shard_begin() != shards_[s].range.begin ||
        r.shard_end() != shards_[s].range.end) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " owns [", r.shard_begin(), ", ", r.shard_end(),
          "); expected [", shards_[s].range.begin, ", ",
          shards_[s].range.end, ")"));
    }
  }
  if (max_step > min_step + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("shards are more than one step apart: their steps range "
                     "from ", min_step, " to ", max_step));
  }
  freezes_ = resps[0].freeze_step() > 0;
  compression_space_ = resps[0].compression_space();
  layout_ = layout;
  replica_.assign(total, 0.0f);
  step_ = min_step;
  for (ShardState& sh : shards_) sh.stage = v1::OPTIMIZER_STAGE_WARMUP;
  registered_ = true;
  return PullAll(step_, std::vector<bool>(num_shards, true),
                 /*registering=*/true, nullptr);
}

v1::OptimizerStage Client::stage() const {
  for (const ShardState& sh : shards_) {
    if (sh.stage != v1::OPTIMIZER_STAGE_COMPRESSION) {
      return v1::OPTIMIZER_STAGE_WARMUP;
    }
  }
  return v1::OPTIMIZER_STAGE_COMPRESSION;
}

absl::StatusOr<uint64_t> Client::Rejoin(size_t s, uint64_t resume_step) {
  ShardState& sh = shards_[s];
  v1::RegisterRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_num_workers(options_.num_workers);
  req.set_shard_index(static_cast<uint32_t>(s));
  req.set_num_shards(static_cast<uint32_t>(shards_.size()));
  *req.mutable_layout() = layout_;
  req.set_resume_step(resume_step);
  v1::EncodedTensor* w = req.mutable_initial_weights();
  w->set_codec(v1::CODEC_FP32);
  w->set_num_elements(sh.range.size());
  w->mutable_payload()->assign(
      reinterpret_cast<const char*>(replica_.data() + sh.range.begin),
      sh.range.size() * sizeof(float));
  v1::RegisterResponse resp;
  absl::Status st = CallAll(
      {s}, options_.rpc_timeout, options_.retry_budget,
      options_.server_addresses, "Register", &stats_.retries,
      [&](size_t, grpc::ClientContext* ctx,
          std::function<void(grpc::Status)> done) {
        sh.stub->async()->Register(ctx, &req, &resp, std::move(done));
      });
  if (!st.ok()) return st;
  ++stats_.rejoins;
  if (absl::Status st = SetStage(s, resp.stage()); !st.ok()) return st;
  return resp.current_step();
}

absl::Status Client::SetStage(size_t s, v1::OptimizerStage stage) {
  ShardState& sh = shards_[s];
  if (stage == sh.stage) return absl::OkStatus();
  sh.stage = stage;
  if (stage == v1::OPTIMIZER_STAGE_COMPRESSION) {
    if (freezes_ && sh.range.size() > 0) return FetchPreconditioner(s);
    return absl::OkStatus();
  }
  // Back to warmup: the shard restarted from nothing, so its frozen
  // variance and the residuals measured against it are gone.
  sh.preconditioner.clear();
  sh.warmup_ef->Reset();
  sh.push_ef->Reset();
  return absl::OkStatus();
}

absl::Status Client::FetchPreconditioner(size_t s) {
  ShardState& sh = shards_[s];
  v1::GetFrozenVarianceRequest req;
  req.set_worker_id(options_.worker_id);
  v1::GetFrozenVarianceResponse resp;
  absl::Status st = CallAll(
      {s}, options_.rpc_timeout, options_.retry_budget,
      options_.server_addresses, "GetFrozenVariance", &stats_.retries,
      [&](size_t, grpc::ClientContext* ctx,
          std::function<void(grpc::Status)> done) {
        sh.stub->async()->GetFrozenVariance(ctx, &req, &resp, std::move(done));
      });
  if (!st.ok()) return st;
  std::vector<float> v(sh.range.size());
  absl::StatusOr<std::unique_ptr<Codec>> dec = MakeDecoderFor(resp.variance());
  if (!dec.ok()) return dec.status();
  if (absl::Status d = (*dec)->Decode(resp.variance(), absl::MakeSpan(v));
      !d.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("frozen variance of shard ", s, ": ", d.message()));
  }
  sh.preconditioner.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    sh.preconditioner[i] = 1.0f / (std::sqrt(v[i]) + resp.eps());
  }
  sh.scratch.resize(v.size());
  // Carry the warmup residual over into the compression-stage residual (in
  // its space), so nothing the warmup codec dropped is lost.
  absl::Span<const float> e = sh.warmup_ef->residual();
  std::vector<float> moved(e.begin(), e.end());
  if (compression_space_ == v1::GRADIENT_SPACE_PRECONDITIONED) {
    for (size_t i = 0; i < moved.size(); ++i) moved[i] *= sh.preconditioner[i];
  }
  return sh.push_ef->SetResidual(moved);
}

absl::Status Client::EncodeShard(size_t s, absl::Span<const float> g,
                                 v1::PushRequest* req) {
  ShardState& sh = shards_[s];
  req->set_worker_id(options_.worker_id);
  req->set_step(step_);
  uint64_t seed = Mix(Mix(options_.seed, options_.worker_id), Mix(step_, s));
  bool compress = !freezes_ || compression_stage(s);
  if (compression_stage(s) &&
      compression_space_ == v1::GRADIENT_SPACE_PRECONDITIONED) {
    for (size_t i = 0; i < g.size(); ++i) {
      sh.scratch[i] = sh.preconditioner[i] * g[i];
    }
    g = sh.scratch;
    req->set_space(v1::GRADIENT_SPACE_PRECONDITIONED);
  } else {
    req->set_space(v1::GRADIENT_SPACE_RAW);
  }
  ErrorFeedback& ef = compress ? *sh.push_ef : *sh.warmup_ef;
  return ef.Encode(g, seed, req->mutable_gradient());
}

absl::Status Client::Step(absl::Span<const float> gradient) {
  if (!registered_) {
    return absl::FailedPreconditionError("Step() before Register()");
  }
  if (gradient.size() != replica_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient has ", gradient.size(), " elements; expected ",
                     replica_.size()));
  }
  for (size_t i = 0; i < gradient.size(); ++i) {
    if (!std::isfinite(gradient[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient[", i, "] is ", gradient[i], "; expected a finite value"));
    }
  }
  const size_t n = shards_.size();
  std::vector<v1::PushRequest> reqs(n);
  std::vector<v1::PushResponse> resps(n);
  absl::Time start = absl::Now();
  for (size_t s = 0; s < n; ++s) {
    const ShardRange& r = shards_[s].range;
    absl::Status st =
        EncodeShard(s, gradient.subspan(r.begin, r.size()), &reqs[s]);
    if (!st.ok()) return st;
    stats_.push_payload_bytes += reqs[s].gradient().payload().size();
    stats_.push_fp32_bytes += Fp32Bytes(r.size());
  }
  stats_.encode_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  start = absl::Now();
  std::vector<size_t> all(n);
  for (size_t s = 0; s < n; ++s) all[s] = s;
  auto push = [&](size_t s, grpc::ClientContext* ctx,
                  std::function<void(grpc::Status)> done) {
    shards_[s].stub->async()->Push(ctx, &reqs[s], &resps[s], std::move(done));
  };
  auto recover = [&](size_t s) -> absl::Status {
    absl::StatusOr<uint64_t> now = Rejoin(s, step_);
    if (!now.ok()) return now.status();
    // Another worker already brought the shard past this step: the round
    // this push was for is over (lost on that shard); just pull.
    if (*now > step_) return absl::OkStatus();
    if (reqs[s].space() != v1::GRADIENT_SPACE_RAW && !compression_stage(s)) {
      const ShardRange& r = shards_[s].range;
      absl::Status e =
          EncodeShard(s, gradient.subspan(r.begin, r.size()), &reqs[s]);
      if (!e.ok()) return e;
    }
    return CallAll({s}, options_.rpc_timeout, options_.retry_budget,
                   options_.server_addresses, "Push", &stats_.retries, push);
  };
  std::vector<absl::Status> pushed =
      CallEach(all, options_.rpc_timeout, options_.retry_budget,
               options_.server_addresses, "Push", &stats_.retries, push);
  std::vector<bool> snapshot(n, false);
  for (size_t s = 0; s < n; ++s) {
    if (pushed[s].ok()) continue;
    if (absl::IsFailedPrecondition(pushed[s])) {
      // The shard is behind this step or lost this worker's registration
      // (it restarted): register again, letting it catch up to step_, and
      // push once more, re-encoded if its stage changed.
      if (absl::Status r = recover(s); !r.ok()) return r;
      snapshot[s] = true;  // its replica is not ours any more
    } else if (absl::IsAborted(pushed[s])) {
      // This round went on without us on that shard (our lease expired):
      // register again to be counted from the next round, and take that
      // round's weights as a snapshot.
      if (absl::Status r = Rejoin(s, 0).status(); !r.ok()) return r;
      snapshot[s] = true;
    } else {
      return pushed[s];
    }
  }
  stats_.push_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  start = absl::Now();
  absl::Status st = PullAll(step_ + 1, std::move(snapshot),
                            /*registering=*/false, recover);
  stats_.pull_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  if (!st.ok()) return st;
  ++stats_.steps;
  return absl::OkStatus();
}

absl::Status Client::PullAll(uint64_t step, std::vector<bool> snapshot,
                             bool registering,
                             const std::function<absl::Status(size_t)>& recover) {
  const size_t n = shards_.size();
  std::vector<size_t> todo(n);
  for (size_t s = 0; s < n; ++s) todo[s] = s;
  for (int attempt = 0; attempt < 4 && !todo.empty(); ++attempt) {
    std::vector<v1::PullRequest> reqs(n);
    std::vector<v1::PullResponse> resps(n);
    for (size_t s : todo) {
      v1::PullRequest& q = reqs[s];
      q.set_worker_id(options_.worker_id);
      q.set_step(step);
      q.set_want_snapshot(snapshot[s]);
      if (!snapshot[s]) {
        q.set_replica_step(static_cast<int64_t>(step_));
        // Verified against the shard when the replica was last updated.
        q.set_replica_checksum(shards_[s].replica_checksum);
      } else {
        q.set_replica_step(-1);
      }
    }
    std::vector<absl::Status> pulled = CallEach(
        todo, options_.pull_timeout, options_.retry_budget,
        options_.server_addresses, "Pull", &stats_.retries,
        [&](size_t s, grpc::ClientContext* ctx,
            std::function<void(grpc::Status)> done) {
          shards_[s].stub->async()->Pull(ctx, &reqs[s], &resps[s],
                                         std::move(done));
        });
    std::vector<size_t> again;
    for (size_t i = 0; i < todo.size(); ++i) {
      const size_t s = todo[i];
      if (!pulled[i].ok()) {
        // The shard restarted behind this step and lost this worker's push:
        // let the caller register again and push again, then pull anew.
        if (absl::IsFailedPrecondition(pulled[i]) && recover) {
          if (absl::Status r = recover(s); !r.ok()) return r;
          snapshot[s] = true;
          again.push_back(s);
          continue;
        }
        return pulled[i];
      }
      absl::Status a = ApplyPull(s, step, registering, resps[s]);
      if (absl::IsDataLoss(a)) {
        ++stats_.checksum_mismatches;
        again.push_back(s);
      } else if (!a.ok()) {
        return a;
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
  step_ = step;
  return absl::OkStatus();
}

absl::Status Client::ApplyPull(size_t s, uint64_t step, bool registering,
                               const v1::PullResponse& resp) {
  ShardState& sh = shards_[s];
  absl::Span<float> slice =
      absl::MakeSpan(replica_).subspan(sh.range.begin, sh.range.size());
  const v1::EncodedTensor& w = resp.weights();
  stats_.pull_payload_bytes += w.payload().size();
  stats_.pull_fp32_bytes += Fp32Bytes(sh.range.size());
  // Checked before the replica is touched. At Register a shard one step
  // ahead (see Register) answers with its newer snapshot.
  const bool ahead = registering && resp.kind() == v1::PULL_KIND_SNAPSHOT &&
                     resp.step() == step + 1;
  if (resp.step() != step && !ahead) {
    return absl::AbortedError(absl::StrCat(
        "shard ", s, " answered with step ", resp.step(), "; expected ", step));
  }
  absl::StatusOr<std::unique_ptr<Codec>> dec = MakeDecoderFor(w);
  if (!dec.ok()) return dec.status();
  absl::Status st;
  if (resp.kind() == v1::PULL_KIND_SNAPSHOT) {
    st = (*dec)->Decode(w, slice);
    ++stats_.snapshots;
  } else if (resp.kind() == v1::PULL_KIND_DELTA) {
    st = (*dec)->DecodeAccumulate(w, 1.0f, slice);
  } else {
    st = absl::InvalidArgumentError("pull response kind is unspecified");
  }
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("pull from shard ", s, " (",
                                                sh.address, "): ",
                                                st.message()));
  }
  if (ChecksumOf(slice) != resp.replica_checksum()) {
    return absl::DataLossError(absl::StrCat(
        "replica of shard ", s, " does not match the shard's checksum"));
  }
  sh.replica_checksum = resp.replica_checksum();
  // An ahead shard may already be past the freeze; the next push follows the
  // lagging shards. Entering the compression stage fetches the frozen
  // preconditioner, once.
  if (!ahead) return SetStage(s, resp.stage());
  return absl::OkStatus();
}

double Client::ResidualNorm() const {
  double sq = 0;
  for (const ShardState& sh : shards_) {
    for (const ErrorFeedback* ef : {sh.warmup_ef.get(), sh.push_ef.get()}) {
      if (ef == nullptr) continue;
      double n = ef->ResidualNorm();
      sq += n * n;
    }
  }
  return std::sqrt(sq);
}

}  // namespace pserver
