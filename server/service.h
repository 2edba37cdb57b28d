// The pserver.v1.ParameterServer gRPC service over one Shard, on the callback
// API. Unary handlers answer on the calling thread; a Pull for a step that
// is not ready yet parks its reactor in the shard until the round completes,
// the client cancels (deadline) or the shard shuts down.
#ifndef PSERVER_SERVER_SERVICE_H_
#define PSERVER_SERVER_SERVICE_H_

#include <functional>

#include "pserver/v1/parameter_server.grpc.pb.h"
#include "server/metrics.h"
#include "server/shard.h"

namespace pserver {

// Thread-safe; the shard and metrics must outlive the service.
class ParameterServerService final
    : public v1::ParameterServer::CallbackService {
 public:
  // `metrics` may be null. `on_registered` runs after every successful
  // Register (e.g. to flip the health status); may be empty.
  ParameterServerService(Shard* shard, ServerMetrics* metrics,
                         std::function<void()> on_registered = {});

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const v1::PushRequest* req,
                                 v1::PushResponse* resp) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const v1::PullRequest* req,
                                 v1::PullResponse* resp) override;
  grpc::ServerUnaryReactor* GetFrozenVariance(
      grpc::CallbackServerContext* ctx,
      const v1::GetFrozenVarianceRequest* req,
      v1::GetFrozenVarianceResponse* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::GetStatusRequest* req,
                                      v1::GetStatusResponse* resp) override;

 private:
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx,
                                   RpcMethod method,
                                   const absl::Status& status);

  Shard* const shard_;
  ServerMetrics* const metrics_;
  const std::function<void()> on_registered_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_SERVICE_H_
