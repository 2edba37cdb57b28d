// A proxy in front of a real shard for the client tests: it forwards
// Register, GetStatus, Push and Pull (with the shard's "pserver-reason" trailer), and
// injects faults the tests ask for: pulls failed with a chosen gRPC code
// (never reaching the shard: to the shard the worker has gone silent), and
// a hook that runs before each push is forwarded (to restart the shard at
// an exact moment).
#ifndef PSERVER_TESTS_WORKER_SHARD_PROXY_H_
#define PSERVER_TESTS_WORKER_SHARD_PROXY_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "pserver/v1/parameter_server.grpc.pb.h"

namespace pserver {
namespace testing_util {

class ShardProxy final : public v1::ParameterServer::Service {
 public:
  explicit ShardProxy(const std::string& target)
      : stub_(v1::ParameterServer::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ShardProxy() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  // "127.0.0.1:port", or "" if the proxy did not start.
  std::string address() const {
    return server_ != nullptr && port_ > 0 ? absl::StrCat("127.0.0.1:", port_)
                                           : "";
  }

  // Nonzero: every pull fails with this gRPC code and is not forwarded.
  std::atomic<int> pull_failure{0};
  // Pulls that failed that way.
  std::atomic<int> pulls_failed{0};

  // Runs (on the proxy's thread) before each push is forwarded.
  void SetBeforePush(std::function<void()> f) {
    absl::MutexLock l(&mu_);
    before_push_ = std::move(f);
  }

  grpc::Status Register(grpc::ServerContext* ctx,
                        const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    return Forward(ctx, &v1::ParameterServer::Stub::Register, *req, resp);
  }
  grpc::Status GetStatus(grpc::ServerContext* ctx,
                         const v1::GetStatusRequest* req,
                         v1::GetStatusResponse* resp) override {
    return Forward(ctx, &v1::ParameterServer::Stub::GetStatus, *req, resp);
  }
  grpc::Status Push(grpc::ServerContext* ctx, const v1::PushRequest* req,
                    v1::PushResponse* resp) override {
    std::function<void()> hook;
    {
      absl::MutexLock l(&mu_);
      hook = before_push_;
    }
    if (hook) hook();
    return Forward(ctx, &v1::ParameterServer::Stub::Push, *req, resp);
  }
  grpc::Status Pull(grpc::ServerContext* ctx, const v1::PullRequest* req,
                    v1::PullResponse* resp) override {
    if (const int code = pull_failure.load(); code != 0) {
      ++pulls_failed;
      return grpc::Status(static_cast<grpc::StatusCode>(code),
                          "injected pull failure");
    }
    return Forward(ctx, &v1::ParameterServer::Stub::Pull, *req, resp);
  }

 private:
  // The call on the shard, with the caller's deadline; its answer, with the
  // shard's reason trailer passed on.
  template <class Req, class Resp>
  grpc::Status Forward(grpc::ServerContext* ctx,
                       grpc::Status (v1::ParameterServer::Stub::*call)(
                           grpc::ClientContext*, const Req&, Resp*),
                       const Req& req, Resp* resp) {
    grpc::ClientContext c;
    c.set_deadline(ctx->deadline());
    grpc::Status st = (stub_.get()->*call)(&c, req, resp);
    if (!st.ok()) {
      const auto& trailers = c.GetServerTrailingMetadata();
      auto it = trailers.find(kReasonTrailer);
      if (it != trailers.end()) {
        ctx->AddTrailingMetadata(
            kReasonTrailer, std::string(it->second.data(), it->second.size()));
      }
    }
    return st;
  }

  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::function<void()> before_push_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_WORKER_SHARD_PROXY_H_
