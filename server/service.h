// The pserver.v1.ParameterServer gRPC service over one Shard, on the callback
// API. Unary handlers answer on the calling thread; a Pull for a step that
// is not ready yet parks its reactor in the shard until the round completes,
// the client cancels (deadline) or the shard shuts down.
//
// Every method is registered raw (grpc::ByteBuffer in and out) and parses its
// request here: gRPC 1.51's callback handler answers a request it cannot
// deserialize with UNIMPLEMENTED and an empty message
// (CallbackUnaryHandler::RunHandler drops the parse status), which clients
// read as "no such method". Parsing ourselves lets such a request be refused
// INVALID_ARGUMENT with the method and the expected type, counted like every
// other refusal. Raw responses also let every waiting pull of a chunk send
// the same serialized bytes (server/pull_answer_bytes.h). A Push of a chunk
// that must wait for an earlier worker's chunk is answered once it is summed,
// so a worker's chunk calls in flight bound what the shard holds for it.
#ifndef PSERVER_SERVER_SERVICE_H_
#define PSERVER_SERVER_SERVICE_H_

#include <atomic>
#include <functional>

#include "grpcpp/support/byte_buffer.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "server/metrics.h"
#include "server/pull_answer_bytes.h"
#include "server/shard.h"

namespace pserver {

using RawParameterServerService =
    v1::ParameterServer::WithRawCallbackMethod_Register<
        v1::ParameterServer::WithRawCallbackMethod_Push<
            v1::ParameterServer::WithRawCallbackMethod_Pull<
                v1::ParameterServer::WithRawCallbackMethod_GetFrozenVariance<
                    v1::ParameterServer::WithRawCallbackMethod_GetStatus<
                        v1::ParameterServer::WithRawCallbackMethod_GetShardState<
                            v1::ParameterServer::
                                WithRawCallbackMethod_InstallShardState<
                                    v1::ParameterServer::
                                        WithRawCallbackMethod_Leave<
                                            v1::ParameterServer::Service>>>>>>>>;

// Thread-safe; the shard and metrics must outlive the service.
class ParameterServerService final : public RawParameterServerService {
 public:
  // `metrics` must not be null (ServerMetrics::Unexported() exports
  // nothing). `on_registered` runs after every successful
  // Register (e.g. to flip the health status); may be empty.
  ParameterServerService(Shard* shard, ServerMetrics* metrics,
                         std::function<void()> on_registered = {});

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetFrozenVariance(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req,
                                              grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetShardState(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req,
                                          grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* InstallShardState(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req,
                                              grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;

  // Returns once every pull answered through the shard's callback has
  // counted itself in the metrics (for up to 5 s). After
  // grpc::Server::Wait() none is left, but a pull cancelled by its client is
  // answered on a gRPC thread (OnCancel), ordered before Wait() only by gRPC
  // core's own synchronization, which ThreadSanitizer cannot see; this
  // makes the order visible before the metrics are destroyed.
  void AwaitPullCallbacks() const;

 private:
  // Counts the call once and finishes it with `status` (and its reason).
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx,
                                   RpcMethod method,
                                   const absl::Status& status);

  Shard* const shard_;
  ServerMetrics* const metrics_;
  const std::function<void()> on_registered_;
  // Pulls whose shard callback has not yet counted the call.
  std::atomic<int64_t> pull_callbacks_{0};
};

}  // namespace pserver

#endif  // PSERVER_SERVER_SERVICE_H_
