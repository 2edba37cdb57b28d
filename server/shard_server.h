// A running shard: the Shard, its gRPC server (ParameterServer and
// grpc.health.v1), and its metrics. Used by the daemon and by tests that need
// a real server in-process (listen on port 0).
#ifndef PSERVER_SERVER_SHARD_SERVER_H_
#define PSERVER_SERVER_SHARD_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "prometheus/registry.h"
#include "server/metrics.h"
#include "server/service.h"
#include "server/shard.h"

namespace pserver {

struct ServerOptions {
  std::string listen_address = "0.0.0.0:50051";
  // Largest request or response. Snapshots of a shard are 4 bytes per
  // element; the default fits 256M elements. Larger requests get
  // RESOURCE_EXHAUSTED from gRPC before any handler runs.
  int max_message_bytes = 1 << 30;
  // Memory gRPC may use for all connections together: a grpc::ResourceQuota
  // over the transport's buffers (messages being received, reads in
  // flight). gRPC checks max_message_bytes only once a message is whole, so
  // without a quota four refused 128 MiB pushes cost ~500 MiB. Past the
  // quota gRPC cancels streams (RESOURCE_EXHAUSTED, "Buffers full"); reads
  // already in flight still land, so the peak measured up to ~40 MiB above
  // it (tests/server/memory_bound_test.cc). 0: no quota; else at least
  // max_message_bytes (Start refuses less).
  size_t grpc_memory_bytes = size_t{2} << 30;
  // TLS, mutual TLS and the shared token (common/tls.h); default plaintext.
  // With a token, calls without it fail UNAUTHENTICATED before any handler.
  TransportSecurity security;
};

// The health service reports "" (the process) SERVING once started, and
// "pserver.v1.ParameterServer" NOT_SERVING until a model is registered.
inline constexpr char kServiceName[] = "pserver.v1.ParameterServer";

// Thread-safe: the gRPC threads call into it (health updates) from the
// moment Start's server listens; Shutdown is called by the owner.
class ShardServer {
 public:
  // `registry` may be null (no metrics). It must outlive the server.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(
      const ShardConfig& config, const ServerOptions& options,
      prometheus::Registry* registry);
  ~ShardServer();

  // The bound port (useful with ":0").
  int port() const { return port_; }
  Shard* shard() { return shard_.get(); }

  // Graceful: refuses new calls, answers waiting pulls with UNAVAILABLE,
  // lets in-flight calls finish for up to `drain`, then cancels the rest.
  // Idempotent; the destructor calls it with no drain time.
  void Shutdown(absl::Duration drain);

 private:
  ShardServer() = default;

  // The service's on_registered callback, on a gRPC thread: marks
  // kServiceName SERVING. A Register can complete while Start is still in
  // BuildAndStart; then health_ is unset and Start itself publishes the
  // registered state (issue 9, hole 3).
  void OnRegistered() ABSL_LOCKS_EXCLUDED(health_mu_);

  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ParameterServerService> service_;
  // Written by Start before it returns and by Shutdown; the gRPC threads
  // never read it (they use health_).
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // Start publishes health_ and the initial statuses in one critical
  // section, so a Register either finds health_ set or completed before
  // Start read shard_->registered(). Null before Start has it and after
  // Shutdown.
  absl::Mutex health_mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(health_mu_) =
      nullptr;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_SHARD_SERVER_H_
