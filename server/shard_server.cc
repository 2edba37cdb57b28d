#include "server/shard_server.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/rate_limited_log.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"

namespace pserver {
namespace {

absl::Status CheckOptions(const ServerOptions& options) {
  if (options.grpc_memory_bytes > 0 &&
      options.grpc_memory_bytes <
          static_cast<size_t>(options.max_message_bytes)) {
    // A quota below one message would refuse every message at the limit.
    return absl::InvalidArgumentError(absl::StrCat(
        "grpc_memory_bytes (--grpc_memory_mb) is ",
        options.grpc_memory_bytes >> 20, " MiB; expected 0 or at least ",
        "max_message_bytes (--max_message_mb), ",
        options.max_message_bytes >> 20, " MiB"));
  }
  return absl::OkStatus();
}

// What a client can make the transport hold: one message per call (refused
// past the limit, but only once received whole), and all calls together
// (the quota; gRPC cancels streams with RESOURCE_EXHAUSTED "Buffers full"
// once past it, issue 9 hole 10b).
void SetMemoryLimits(const ServerOptions& options,
                     grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(options.max_message_bytes);
  if (options.grpc_memory_bytes > 0) {
    grpc::ResourceQuota quota("pserver_shard");
    quota.Resize(options.grpc_memory_bytes);
    builder->SetResourceQuota(quota);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    const ShardConfig& config, const ServerOptions& options,
    prometheus::Registry* registry) {
  if (absl::Status st = CheckOptions(options); !st.ok()) return st;
  RateLimitProtobufLogs();
  std::unique_ptr<ShardServer> s(new ShardServer());
  s->metrics_ = registry != nullptr
                    ? std::make_unique<ServerMetrics>(*registry, config.shard_index)
                    : ServerMetrics::Unexported(config.shard_index);
  // The transport's message limit bounds the model a Register may install,
  // so a snapshot can always be sent.
  ShardConfig shard_config = config;
  shard_config.max_response_bytes = static_cast<uint64_t>(options.max_message_bytes);
  absl::StatusOr<std::unique_ptr<Shard>> shard =
      Shard::Create(shard_config, s->metrics_.get());
  if (!shard.ok()) return shard.status();
  s->shard_ = std::move(shard).value();

  grpc::EnableDefaultHealthCheckService(true);
  ShardServer* self = s.get();
  s->service_ = std::make_unique<ParameterServerService>(
      s->shard_.get(), s->metrics_.get(), [self] { self->OnRegistered(); });
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address,
                           MakeServerCredentials(options.security), &s->port_);
  builder.RegisterService(s->service_.get());
  // gRPC binds with SO_REUSEPORT by default: a second shard on a port in
  // use would share it silently (two clusters' calls mixed). Refuse it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  SetMemoryLimits(options, &builder);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen_address,
        options.security.tls(TransportSecurity::kServer)
            ? " (or the TLS certificate and key do not load or match)"
            : ""));
  }
  {
    absl::MutexLock lock(&s->health_mu_);
    s->health_ = s->server_->GetHealthCheckService();
    s->health_->SetServingStatus("", true);
    // Read under health_mu_: a Register that completed before this line
    // found health_ unset and is counted here; any later one runs
    // OnRegistered after this section and finds health_ set.
    s->health_->SetServingStatus(kServiceName, s->shard_->registered());
  }
  return s;
}

void ShardServer::OnRegistered() {
  absl::MutexLock lock(&health_mu_);
  if (health_ != nullptr) health_->SetServingStatus(kServiceName, true);
}

ShardServer::~ShardServer() { Shutdown(absl::ZeroDuration()); }

void ShardServer::Shutdown(absl::Duration drain) {
  if (!server_) return;
  {
    // Every status reads NOT_SERVING from here on; later updates are
    // ignored by gRPC. (Unset if Start failed after BuildAndStart.)
    absl::MutexLock lock(&health_mu_);
    if (health_ != nullptr) health_->Shutdown();
  }
  shard_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + drain));
  server_->Wait();
  service_->AwaitPullCallbacks();
  {
    // No handler runs any more; the health service dies with server_.
    absl::MutexLock lock(&health_mu_);
    health_ = nullptr;
  }
  server_.reset();
  // In-flight calls are done: the state is final.
  if (absl::Status s = shard_->Close(); !s.ok()) {
    std::fprintf(stderr, "pserver: final checkpoint failed: %s\n",
                 std::string(s.message()).c_str());
  }
}

}  // namespace pserver
