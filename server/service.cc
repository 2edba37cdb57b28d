#include "server/service.h"

#include <atomic>
#include <climits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/rejection.h"
#include "server/pull_answer_bytes.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace pserver {
namespace {

// Parses a raw request. INVALID_ARGUMENT (REJECT_REASON_MALFORMED_REQUEST)
// naming the method and the expected message type if the bytes are not one.
// The request's slices are shared, not copied.
template <class Request>
absl::Status ParseRequest(RpcMethod method, const grpc::ByteBuffer& raw,
                          Request* out) {
  grpc::ByteBuffer shared(raw);
  const size_t size = shared.Valid() ? shared.Length() : 0;
  bool parsed = false;
  // protobuf parses at most INT_MAX bytes; gRPC's receive limit (at most
  // 2047 MiB, server/main.cc) keeps requests below it, checked here anyway.
  if (size <= static_cast<size_t>(INT_MAX)) {
    if (!shared.Valid()) {
      out->Clear();  // an empty message
      parsed = true;
    } else {
      grpc::ProtoBufferReader reader(&shared);
      parsed = out->ParseFromZeroCopyStream(&reader) && reader.status().ok();
    }
  }
  if (parsed) return absl::OkStatus();
  return Reject(v1::REJECT_REASON_MALFORMED_REQUEST,
                absl::InvalidArgumentError(absl::StrCat(
                    RpcMethodName(method), ": request is not a valid ",
                    Request::descriptor()->full_name(), " (", size,
                    " bytes that do not parse as one)")));
}

template <class Response>
absl::Status SerializeResponse(const Response& msg, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  grpc::Status s =
      grpc::SerializationTraits<Response>::Serialize(msg, out, &own_buffer);
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cannot serialize the ",
                                          Response::descriptor()->full_name(),
                                          ": ", s.error_message()));
}

// A Push whose chunk was queued behind an earlier worker's: answered when
// the shard has summed (or dropped) it. Finish() runs once both the shard's
// Push returned and, for a queued chunk, the shard called back (which may
// happen first, on the same thread).
class PushReactor final : public grpc::ServerUnaryReactor {
 public:
  PushReactor(grpc::CallbackServerContext* ctx, Shard* shard,
              ServerMetrics* metrics,
              std::shared_ptr<v1::PushRequest> req,
              grpc::ByteBuffer* resp)
      : ctx_(ctx), metrics_(metrics) {
    bool queued = false;
    absl::StatusOr<v1::PushResponse> r =
        shard->Push(std::move(req), [this] { Arrive(); }, &queued);
    status_ = r.ok() ? SerializeResponse(*r, resp) : r.status();
    if (!queued) left_.store(1);
    Arrive();
  }
  void OnDone() override { delete this; }

 private:
  void Arrive() {
    if (left_.fetch_sub(1) != 1) return;
    metrics_->CountRequest(RpcMethod::kPush, status_);
    Finish(ToGrpcStatus(status_, ctx_));
  }

  grpc::CallbackServerContext* const ctx_;
  ServerMetrics* const metrics_;
  absl::Status status_;  // written before the last Arrive()
  std::atomic<int> left_{2};
};

// A Pull that may wait: the shard calls back exactly once, and only then is
// Finish() called; OnDone() (after Finish) frees the reactor. Every pull
// answered with the same shared answer sends the same serialized bytes.
class PullReactor final : public grpc::ServerUnaryReactor {
 public:
  PullReactor(grpc::CallbackServerContext* ctx, Shard* shard,
              ServerMetrics* metrics, std::atomic<int64_t>* callbacks,
              const v1::PullRequest& req, grpc::ByteBuffer* resp)
      : ctx_(ctx), shard_(shard), metrics_(metrics) {
    callbacks->fetch_add(1, std::memory_order_relaxed);
    uint64_t id = shard_->Pull(req, [this, resp, callbacks](
                                        absl::Status s, PullAnswer answer) {
      if (s.ok()) *resp = PullAnswerBuffer(std::move(answer));
      metrics_->CountRequest(RpcMethod::kPull, s);
      // Pairs with AwaitPullCallbacks(): the count above happens before the
      // metrics can be destroyed.
      callbacks->fetch_sub(1, std::memory_order_release);
      Finish(ToGrpcStatus(s, ctx_));
    });
    id_.store(id);
  }

  void OnCancel() override {
    uint64_t id = id_.load();
    if (id != 0) {
      shard_->CancelPull(id, absl::CancelledError("pull cancelled by the client"
                                                  " (deadline or cancel)"));
    }
  }
  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* const ctx_;
  Shard* const shard_;
  ServerMetrics* const metrics_;
  std::atomic<uint64_t> id_{0};
};

}  // namespace

ParameterServerService::ParameterServerService(
    Shard* shard, ServerMetrics* metrics, std::function<void()> on_registered)
    : shard_(shard),
      metrics_(metrics),
      on_registered_(std::move(on_registered)) {}

grpc::ServerUnaryReactor* ParameterServerService::Answer(
    grpc::CallbackServerContext* ctx, RpcMethod method,
    const absl::Status& status) {
  metrics_->CountRequest(method, status);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status, ctx));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Register(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  v1::RegisterRequest req;
  absl::Status s = ParseRequest(RpcMethod::kRegister, *raw, &req);
  if (!s.ok()) return Answer(ctx, RpcMethod::kRegister, s);
  absl::StatusOr<v1::RegisterResponse> r = shard_->Register(req);
  if (r.ok()) {
    s = SerializeResponse(*r, resp);
    if (on_registered_) on_registered_();
  } else {
    s = r.status();
  }
  return Answer(ctx, RpcMethod::kRegister, s);
}

grpc::ServerUnaryReactor* ParameterServerService::Push(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  auto req = std::make_shared<v1::PushRequest>();
  absl::Status s = ParseRequest(RpcMethod::kPush, *raw, req.get());
  if (!s.ok()) return Answer(ctx, RpcMethod::kPush, s);
  return new PushReactor(ctx, shard_, metrics_, std::move(req), resp);
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  v1::PullRequest req;
  absl::Status s = ParseRequest(RpcMethod::kPull, *raw, &req);
  if (!s.ok()) return Answer(ctx, RpcMethod::kPull, s);
  return new PullReactor(ctx, shard_, metrics_, &pull_callbacks_, req, resp);
}

void ParameterServerService::AwaitPullCallbacks() const {
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (pull_callbacks_.load(std::memory_order_acquire) != 0 &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
}

grpc::ServerUnaryReactor* ParameterServerService::GetFrozenVariance(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  v1::GetFrozenVarianceRequest req;
  absl::Status s = ParseRequest(RpcMethod::kGetFrozenVariance, *raw, &req);
  if (!s.ok()) return Answer(ctx, RpcMethod::kGetFrozenVariance, s);
  absl::StatusOr<v1::GetFrozenVarianceResponse> r =
      shard_->GetFrozenVariance(req);
  s = r.ok() ? SerializeResponse(*r, resp) : r.status();
  return Answer(ctx, RpcMethod::kGetFrozenVariance, s);
}

grpc::ServerUnaryReactor* ParameterServerService::GetStatus(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  v1::GetStatusRequest req;
  absl::Status s = ParseRequest(RpcMethod::kGetStatus, *raw, &req);
  if (!s.ok()) return Answer(ctx, RpcMethod::kGetStatus, s);
  return Answer(ctx, RpcMethod::kGetStatus,
                SerializeResponse(shard_->Status(), resp));
}

grpc::ServerUnaryReactor* ParameterServerService::GetShardState(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  v1::GetShardStateRequest req;
  absl::Status s = ParseRequest(RpcMethod::kGetShardState, *raw, &req);
  if (!s.ok()) return Answer(ctx, RpcMethod::kGetShardState, s);
  absl::StatusOr<v1::GetShardStateResponse> r = shard_->GetShardState(req);
  s = r.ok() ? SerializeResponse(*r, resp) : r.status();
  return Answer(ctx, RpcMethod::kGetShardState, s);
}

grpc::ServerUnaryReactor* ParameterServerService::InstallShardState(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  v1::InstallShardStateRequest req;
  absl::Status s = ParseRequest(RpcMethod::kInstallShardState, *raw, &req);
  if (!s.ok()) return Answer(ctx, RpcMethod::kInstallShardState, s);
  absl::StatusOr<v1::InstallShardStateResponse> r =
      shard_->InstallShardState(req);
  s = r.ok() ? SerializeResponse(*r, resp) : r.status();
  return Answer(ctx, RpcMethod::kInstallShardState, s);
}

grpc::ServerUnaryReactor* ParameterServerService::Leave(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp) {
  v1::LeaveRequest req;
  absl::Status s = ParseRequest(RpcMethod::kLeave, *raw, &req);
  if (!s.ok()) return Answer(ctx, RpcMethod::kLeave, s);
  absl::StatusOr<v1::LeaveResponse> r = shard_->Leave(req);
  s = r.ok() ? SerializeResponse(*r, resp) : r.status();
  return Answer(ctx, RpcMethod::kLeave, s);
}

}  // namespace pserver
