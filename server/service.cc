#include "server/service.h"

#include <atomic>
#include <utility>

#include "common/grpc_status.h"

namespace pserver {
namespace {

// A Pull that may wait: the shard calls back exactly once, and only then is
// Finish() called; OnDone() (after Finish) frees the reactor.
class PullReactor final : public grpc::ServerUnaryReactor {
 public:
  PullReactor(grpc::CallbackServerContext* ctx, Shard* shard,
              ServerMetrics* metrics, const v1::PullRequest* req,
              v1::PullResponse* resp)
      : ctx_(ctx), shard_(shard), metrics_(metrics) {
    uint64_t id = shard_->Pull(*req, [this, resp](absl::Status s,
                                                  PullAnswer answer) {
      if (s.ok()) *resp = *answer;
      metrics_->CountRequest(RpcMethod::kPull, s);
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
    grpc::CallbackServerContext* ctx, const v1::RegisterRequest* req,
    v1::RegisterResponse* resp) {
  absl::StatusOr<v1::RegisterResponse> r = shard_->Register(*req);
  if (r.ok()) {
    *resp = *std::move(r);
    if (on_registered_) on_registered_();
  }
  return Answer(ctx, RpcMethod::kRegister, r.status());
}

grpc::ServerUnaryReactor* ParameterServerService::Push(
    grpc::CallbackServerContext* ctx, const v1::PushRequest* req,
    v1::PushResponse* resp) {
  absl::StatusOr<v1::PushResponse> r = shard_->Push(*req);
  if (r.ok()) *resp = *std::move(r);
  return Answer(ctx, RpcMethod::kPush, r.status());
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(
    grpc::CallbackServerContext* ctx, const v1::PullRequest* req,
    v1::PullResponse* resp) {
  return new PullReactor(ctx, shard_, metrics_, req, resp);
}

grpc::ServerUnaryReactor* ParameterServerService::GetFrozenVariance(
    grpc::CallbackServerContext* ctx, const v1::GetFrozenVarianceRequest* req,
    v1::GetFrozenVarianceResponse* resp) {
  absl::StatusOr<v1::GetFrozenVarianceResponse> r =
      shard_->GetFrozenVariance(*req);
  if (r.ok()) *resp = *std::move(r);
  return Answer(ctx, RpcMethod::kGetFrozenVariance, r.status());
}

grpc::ServerUnaryReactor* ParameterServerService::GetStatus(
    grpc::CallbackServerContext* ctx, const v1::GetStatusRequest* req,
    v1::GetStatusResponse* resp) {
  *resp = shard_->Status();
  return Answer(ctx, RpcMethod::kGetStatus, absl::OkStatus());
}

}  // namespace pserver
