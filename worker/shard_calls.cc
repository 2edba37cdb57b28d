#include "worker/shard_calls.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/rejection.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace pserver {
namespace {

bool Retriable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

// What the operator sees of one call's retries (ClientMetrics::Note): a line
// when a shard first fails retriably, and one when it answers again.
class ShardCalls::RetryNotes {
 public:
  RetryNotes(const ShardCalls& calls, const char* method)
      : calls_(calls), method_(method) {}

  void Failed(size_t s, const grpc::Status& st) {
    if (!since_.emplace(s, absl::Now()).second) return;
    calls_.metrics_->Note(absl::StrCat(
        method_, " to shard ", s, " (", calls_.address(s), ") failed: ",
        StatusCodeName(st.error_code()), ": ", st.error_message(),
        "; retrying for up to ",
        absl::FormatDuration(calls_.options_.retry_budget)));
  }

  // `st`: the attempt's result; only an answer of the shard's counts (not
  // a retriable failure, nor a call this client cancelled).
  void Answered(size_t s, const grpc::Status& st = grpc::Status::OK) {
    if (Retriable(st) || st.error_code() == grpc::StatusCode::CANCELLED) return;
    auto it = since_.find(s);
    if (it == since_.end()) return;
    calls_.metrics_->Note(absl::StrCat(
        method_, " to shard ", s, " (", calls_.address(s),
        ") answers again after ",
        absl::FormatDuration(absl::Trunc(absl::Now() - it->second,
                                         absl::Milliseconds(100)))));
    since_.erase(it);
  }

 private:
  static const char* StatusCodeName(grpc::StatusCode c) {
    return c == grpc::StatusCode::UNAVAILABLE ? "UNAVAILABLE"
                                              : "DEADLINE_EXCEEDED";
  }

  const ShardCalls& calls_;
  const char* method_;
  std::map<size_t, absl::Time> since_;
};

std::unique_ptr<ShardCalls> ShardCalls::Create(const ShardCallOptions& options,
                                               ClientMetrics* metrics) {
  return std::unique_ptr<ShardCalls>(new ShardCalls(options, metrics));
}

ShardCalls::ShardCalls(const ShardCallOptions& options, ClientMetrics* metrics)
    : options_(options), metrics_(metrics) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  for (const std::string& address : options.addresses) {
    stubs_.push_back(v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
        address, MakeChannelCredentials(options.security), args)));
  }
}

ShardCalls::~ShardCalls() = default;

absl::Status ShardCalls::Abandoned(const char* method, size_t s) const {
  return absl::CancelledError(absl::StrCat(
      method, " to shard ", s, " (", address(s),
      "): abandoned (the client is going away)"));
}

absl::Status ShardCalls::CallError(const char* method, size_t s,
                                   const grpc::Status& status,
                                   const grpc::ClientContext& ctx) const {
  absl::Status st = FromGrpcStatus(status, ctx);
  absl::Status prefixed(st.code(),
                        absl::StrCat(method, " to shard ", s, " (", address(s),
                                     "): ", st.message()));
  const v1::RejectReason reason = ReasonOf(st);
  return reason == v1::REJECT_REASON_UNSPECIFIED
             ? prefixed
             : Reject(reason, std::move(prefixed));
}

std::vector<absl::Status> ShardCalls::CallEach(
    const std::vector<size_t>& shards, absl::Duration attempt_timeout,
    const char* method, Start start, bool retry_busy) {
  std::vector<absl::Status> out(shards.size());
  std::vector<size_t> pending(shards.size());  // indexes into shards
  for (size_t i = 0; i < shards.size(); ++i) pending[i] = i;
  const absl::Time give_up = absl::Now() + options_.retry_budget;
  absl::Duration backoff = absl::Milliseconds(50);
  RetryNotes notes(*this, method);
  while (!pending.empty()) {
    std::vector<grpc::Status> result(pending.size());
    std::vector<std::unique_ptr<grpc::ClientContext>> ctx(pending.size());
    absl::BlockingCounter left(static_cast<int>(pending.size()));
    for (size_t i = 0; i < pending.size(); ++i) {
      ctx[i] = std::make_unique<grpc::ClientContext>();
      ctx[i]->set_deadline(absl::ToChronoTime(absl::Now() + attempt_timeout));
      // Wait for a shard that is (re)starting instead of failing at once.
      ctx[i]->set_wait_for_ready(true);
      start(shards[pending[i]], ctx[i].get(),
            [&result, &left, i](grpc::Status s) {
              result[i] = std::move(s);
              left.DecrementCount();
            });
    }
    left.Wait();
    std::vector<size_t> again;
    for (size_t i = 0; i < pending.size(); ++i) {
      const size_t shard = shards[pending[i]];
      if (result[i].ok()) {
        out[pending[i]] = absl::OkStatus();
        notes.Answered(shard);
      } else if (Retriable(result[i]) && absl::Now() < give_up &&
                 (retry_busy ||
                  ReasonOf(FromGrpcStatus(result[i], *ctx[i])) !=
                      v1::REJECT_REASON_BUSY)) {
        // A busy shard (another worker installing the model) is waited
        // for, not reported.
        if (result[i].error_code() != grpc::StatusCode::UNAVAILABLE ||
            ReasonOf(FromGrpcStatus(result[i], *ctx[i])) !=
                v1::REJECT_REASON_BUSY) {
          notes.Failed(shard, result[i]);
        }
        again.push_back(pending[i]);
      } else {
        notes.Answered(shard, result[i]);  // an answer: it is back
        out[pending[i]] = CallError(method, shard, result[i], *ctx[i]);
      }
    }
    if (again.empty()) break;
    if (abandoned_.load()) {
      for (size_t i : again) out[i] = Abandoned(method, shards[i]);
      break;
    }
    metrics_->CountRetries(again.size());
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
    pending = std::move(again);
  }
  return out;
}

std::vector<absl::Status> ShardCalls::Register(
    const std::vector<size_t>& shards,
    const std::vector<v1::RegisterRequest>& reqs,
    std::vector<v1::RegisterResponse>* resps, bool retry_busy) {
  return CallEach(
      shards, options_.rpc_timeout, "Register",
      [&](size_t s, grpc::ClientContext* ctx, Done done) {
        stubs_[s]->async()->Register(ctx, &reqs[s], &(*resps)[s],
                                     std::move(done));
      },
      retry_busy);
}

absl::Status ShardCalls::Register(size_t s, const v1::RegisterRequest& req,
                                  v1::RegisterResponse* resp) {
  return CallEach({s}, options_.rpc_timeout, "Register",
                  [&](size_t, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->Register(ctx, &req, resp,
                                                 std::move(done));
                  })[0];
}

std::vector<absl::Status> ShardCalls::Status(
    const std::vector<size_t>& shards,
    std::vector<v1::GetStatusResponse>* resps) {
  resps->resize(stubs_.size());
  std::vector<v1::GetStatusRequest> reqs(stubs_.size());
  return CallEach(shards, options_.rpc_timeout, "GetStatus",
                  [&](size_t s, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->GetStatus(ctx, &reqs[s], &(*resps)[s],
                                                  std::move(done));
                  });
}

template <class Req, class Resp>
struct ShardCalls::Slots {
  struct Slot {
    Req req;
    Resp resp;
    std::unique_ptr<grpc::ClientContext> ctx;
    uint32_t chunk = 0;
    bool busy = false;   // holds a chunk: in flight or waiting to be resent
    bool retry = false;  // waiting to be resent at retry_at
    absl::Time retry_at;
    absl::Duration backoff = absl::Milliseconds(50);
  };
  Slot slot[kWindow];
};

template <class Req, class Resp, class Issue>
std::vector<absl::Status> ShardCalls::CallChunks(
    const char* method, absl::Duration attempt_timeout,
    const std::vector<size_t>& shards, const std::vector<uint32_t>& chunks,
    std::vector<std::unique_ptr<Slots<Req, Resp>>>* slots,
    absl::FunctionRef<absl::Status(size_t, uint32_t, Req*)> prepare,
    absl::FunctionRef<absl::Status(size_t, uint32_t, const Resp&)> finish,
    Issue issue, const ChunkOrder& order, std::vector<bool>* interrupted) {
  struct Event {
    size_t i;  // index into shards
    int k;     // slot
    grpc::Status status;
  };
  // Filled by gRPC's threads, drained by this one.
  absl::Mutex mu;
  absl::CondVar cv;
  std::deque<Event> events;

  const size_t m = shards.size();
  if (slots->size() < stubs_.size()) slots->resize(stubs_.size());
  for (size_t s : shards) {
    if ((*slots)[s] == nullptr) (*slots)[s] = std::make_unique<Slots<Req, Resp>>();
  }
  std::vector<absl::Status> out(m);
  if (interrupted != nullptr) interrupted->assign(m, false);
  std::vector<uint32_t> next(m, 0);
  std::vector<int> in_flight(m, 0);
  const absl::Time give_up = absl::Now() + options_.retry_budget;
  RetryNotes notes(*this, method);
  auto slot_of = [&](size_t i, int k) -> typename Slots<Req, Resp>::Slot& {
    return (*slots)[shards[i]]->slot[k];
  };
  auto send = [&](size_t i, int k) {
    auto& slot = slot_of(i, k);
    slot.ctx = std::make_unique<grpc::ClientContext>();
    slot.ctx->set_deadline(absl::ToChronoTime(absl::Now() + attempt_timeout));
    slot.ctx->set_wait_for_ready(true);
    ++in_flight[i];
    issue(shards[i], slot.ctx.get(), &slot.req, &slot.resp,
          [&mu, &cv, &events, i, k](grpc::Status st) {
            absl::MutexLock l(&mu);
            events.push_back(Event{i, k, std::move(st)});
            cv.Signal();
          });
  };
  auto fail = [&](size_t i, absl::Status st) {
    if (!out[i].ok()) return;
    out[i] = std::move(st);
    // Stop what is still in flight for this shard: its step failed.
    for (int k = 0; k < kWindow; ++k) {
      auto& slot = slot_of(i, k);
      if (slot.busy && !slot.retry && slot.ctx != nullptr) slot.ctx->TryCancel();
    }
  };
  // Shard i failed (a refusal, an error, the retry budget spent): with
  // `interrupted`, the other shards' calls still under way stop too, so
  // the caller can recover shard i first. Waiting for them could wait
  // forever: a shard answers a push once it is summed, after the lower
  // workers' pushes of that chunk, and those workers may be waiting for
  // this one to rejoin shard i (a restarted shard).
  auto failed = [&](size_t i, absl::Status st) {
    if (!out[i].ok()) return;  // already failed (or interrupted)
    fail(i, std::move(st));
    if (interrupted == nullptr) return;
    for (size_t j = 0; j < m; ++j) {
      if (j == i || !out[j].ok()) continue;
      bool busy = next[j] < chunks[j];
      for (int k = 0; k < kWindow && !busy; ++k) busy = slot_of(j, k).busy;
      if (!busy) continue;  // every chunk answered: that shard is done
      (*interrupted)[j] = true;
      fail(j, absl::AbortedError(absl::StrCat(
                  method, " to shard ", shards[j], " (", address(shards[j]),
                  ") interrupted: shard ", shards[i], " failed first")));
    }
  };
  while (true) {
    const absl::Time now = absl::Now();
    absl::Time wake = absl::InfiniteFuture();
    bool waiting = false;
    if (abandoned_.load()) {
      // Cancels what is in flight (fail) and drops what waits to be resent.
      for (size_t i = 0; i < m; ++i) fail(i, Abandoned(method, shards[i]));
    }
    for (size_t i = 0; i < m; ++i) {
      for (int k = 0; k < kWindow; ++k) {
        auto& slot = slot_of(i, k);
        if (!slot.busy || !slot.retry) continue;
        if (!out[i].ok()) {
          slot.retry = slot.busy = false;
        } else if (slot.retry_at <= now) {
          slot.retry = false;
          send(i, k);
        } else {
          wake = std::min(wake, slot.retry_at);
          waiting = true;
        }
      }
      for (int k = 0; k < kWindow && out[i].ok() && next[i] < chunks[i]; ++k) {
        auto& slot = slot_of(i, k);
        if (slot.busy) continue;
        int64_t c = next[i];
        if (order != nullptr) {
          c = order(shards[i]);
          if (c < 0) {
            // Nothing ready to send yet: look again shortly.
            wake = std::min(wake, now + kReadyPoll);
            waiting = true;
            break;
          }
        }
        slot.chunk = static_cast<uint32_t>(c);
        slot.backoff = absl::Milliseconds(50);
        if (absl::Status st = prepare(shards[i], slot.chunk, &slot.req);
            !st.ok()) {
          failed(i, std::move(st));
          break;
        }
        slot.busy = true;
        ++next[i];
        send(i, k);
      }
      if (in_flight[i] > 0) waiting = true;
    }
    if (!waiting) break;
    Event ev;
    {
      absl::MutexLock l(&mu);
      // Looks up at least every kAbandonPoll: an owner may abandon the
      // calls while answers are awaited.
      const absl::Time until = std::min(wake, absl::Now() + kAbandonPoll);
      while (events.empty()) {
        if (cv.WaitWithDeadline(&mu, until)) break;  // a retry is due
      }
      if (events.empty()) continue;
      ev = std::move(events.front());
      events.pop_front();
    }
    --in_flight[ev.i];
    auto& slot = slot_of(ev.i, ev.k);
    if (ev.status.ok()) {
      slot.busy = false;
      notes.Answered(shards[ev.i]);
      if (out[ev.i].ok()) {
        if (absl::Status st = finish(shards[ev.i], slot.chunk, slot.resp);
            !st.ok()) {
          failed(ev.i, std::move(st));
        }
      }
    } else if (out[ev.i].ok() && Retriable(ev.status) && absl::Now() < give_up) {
      notes.Failed(shards[ev.i], ev.status);
      slot.retry = true;
      slot.retry_at = absl::Now() + slot.backoff;
      slot.backoff = std::min(slot.backoff * 2, absl::Seconds(2));
      metrics_->CountRetries(1);
    } else {
      slot.busy = false;
      notes.Answered(shards[ev.i], ev.status);  // an answer: it is back
      failed(ev.i, CallError(method, shards[ev.i], ev.status, *slot.ctx));
    }
  }
  return out;
}

std::vector<absl::Status> ShardCalls::PushChunks(
    const std::vector<size_t>& shards, const std::vector<uint32_t>& chunks,
    PreparePush prepare, FinishPush finish, const ChunkOrder& order,
    std::vector<bool>* interrupted) {
  return CallChunks<v1::PushRequest, v1::PushResponse>(
      "Push", options_.rpc_timeout, shards, chunks, &push_slots_, prepare,
      finish,
      [this](size_t s, grpc::ClientContext* ctx, const v1::PushRequest* req,
             v1::PushResponse* resp, Done done) {
        stubs_[s]->async()->Push(ctx, req, resp, std::move(done));
      },
      order, interrupted);
}

std::vector<absl::Status> ShardCalls::PullChunks(
    const std::vector<size_t>& shards, const std::vector<uint32_t>& chunks,
    PreparePull prepare, FinishPull finish, std::vector<bool>* interrupted) {
  return CallChunks<v1::PullRequest, v1::PullResponse>(
      "Pull", options_.pull_timeout, shards, chunks, &pull_slots_, prepare,
      finish,
      [this](size_t s, grpc::ClientContext* ctx, const v1::PullRequest* req,
             v1::PullResponse* resp, Done done) {
        stubs_[s]->async()->Pull(ctx, req, resp, std::move(done));
      },
      nullptr, interrupted);
}

std::vector<absl::Status> ShardCalls::FrozenVarianceChunks(
    const std::vector<size_t>& shards, const std::vector<uint32_t>& chunks,
    PrepareVariance prepare, FinishVariance finish) {
  std::vector<absl::Status> out =
      CallChunks<v1::GetFrozenVarianceRequest, v1::GetFrozenVarianceResponse>(
          "GetFrozenVariance", options_.rpc_timeout, shards, chunks,
          &variance_slots_, prepare, finish,
          [this](size_t s, grpc::ClientContext* ctx,
                 const v1::GetFrozenVarianceRequest* req,
                 v1::GetFrozenVarianceResponse* resp, Done done) {
            stubs_[s]->async()->GetFrozenVariance(ctx, req, resp,
                                                  std::move(done));
          },
          nullptr, nullptr);
  // Needed once per shard (at the freeze): free the buffers.
  for (size_t s : shards) variance_slots_[s].reset();
  return out;
}

std::vector<absl::Status> ShardCalls::RegisterChunks(
    const std::vector<size_t>& shards, const std::vector<uint32_t>& chunks,
    PrepareRegister prepare, FinishRegister finish) {
  std::vector<absl::Status> out =
      CallChunks<v1::RegisterRequest, v1::RegisterResponse>(
          "Register", options_.rpc_timeout, shards, chunks, &register_slots_,
          prepare, finish,
          [this](size_t s, grpc::ClientContext* ctx,
                 const v1::RegisterRequest* req, v1::RegisterResponse* resp,
                 Done done) {
            stubs_[s]->async()->Register(ctx, req, resp, std::move(done));
          },
          nullptr, nullptr);
  // Weight chunks are needed once per shard: free their buffers.
  for (size_t s : shards) register_slots_[s].reset();
  return out;
}

}  // namespace pserver
