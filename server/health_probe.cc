// pserver_health_probe: asks a gRPC server's health service (grpc.health.v1)
// whether it serves, for container healthchecks and Kubernetes exec probes.
// Exits 0 iff the answer is SERVING; otherwise prints one line saying why and
// exits 1 (the only failure code Docker's HEALTHCHECK defines).
//
//   pserver_health_probe --address=127.0.0.1:50051            # the process
//   pserver_health_probe --service=pserver.v1.ParameterServer # a model is in
//
// A shard answers SERVING for service "" as soon as it listens, and for
// "pserver.v1.ParameterServer" only once the first worker has registered the
// model: gate workers on "" or they would wait for themselves.
//
// Against a shard with TLS give the probe --tls_ca (the CA of the shard's
// certificate), for mutual TLS also --tls_cert/--tls_key of a client
// certificate, and --auth_token_file (or PSERVER_AUTH_TOKEN) when the shard
// wants a token: the health service sits behind the same checks. A shard
// certificate issued for its DNS name is checked with --tls_server_name.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "common/daemon/command_line.h"
#include "common/daemon/daemon_flags.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server to ask, host:port");
ABSL_FLAG(std::string, service, "",
          "service to ask about; \"\" is the whole server");
ABSL_FLAG(double, timeout, 3, "seconds to wait for the answer");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA the server's certificate must chain to; turns on TLS");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate chain for mutual TLS (needs --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name to check the server's certificate against instead of the "
          "host in --address (e.g. its DNS name when probing 127.0.0.1)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the shared token (empty: PSERVER_AUTH_TOKEN, if set)");

namespace {

const char* StatusName(grpc::health::v1::HealthCheckResponse::ServingStatus s) {
  using R = grpc::health::v1::HealthCheckResponse;
  switch (s) {
    case R::SERVING: return "SERVING";
    case R::NOT_SERVING: return "NOT_SERVING";
    case R::SERVICE_UNKNOWN: return "SERVICE_UNKNOWN";
    default: return "UNKNOWN";
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Exit 1 for every failure: the only code Docker's HEALTHCHECK defines.
  pserver::ParseDaemonCommandLine(
      argc, argv,
      {"pserver_health_probe",
       "Exits 0 iff the gRPC health service at --address answers SERVING for "
       "--service.\n"
       "  pserver_health_probe --address=127.0.0.1:50051 "
       "[--service=pserver.v1.ParameterServer]",
       __FILE__, /*error_exit_code=*/1});
  const std::string address = absl::GetFlag(FLAGS_address);
  const std::string service = absl::GetFlag(FLAGS_service);
  const double timeout = absl::GetFlag(FLAGS_timeout);
  if (!(timeout > 0)) {
    std::fprintf(stderr, "pserver_health_probe: --timeout is %g; expected > 0\n",
                 timeout);
    return 1;
  }

  absl::StatusOr<pserver::TransportSecurity> security =
      pserver::LoadSecurityFromFlags(
          {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
           absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_auth_token_file)},
          pserver::TransportSecurity::kClient);
  if (!security.ok()) {
    std::fprintf(stderr, "pserver_health_probe: %s\n",
                 std::string(security.status().message()).c_str());
    return 1;
  }
  grpc::ChannelArguments args;
  if (std::string name = absl::GetFlag(FLAGS_tls_server_name); !name.empty()) {
    args.SetSslTargetNameOverride(name);
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
      address, pserver::MakeChannelCredentials(*security), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(
                           static_cast<int64_t>(timeout * 1e6)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  const std::string what =
      "service \"" + service + "\" at " + address;
  if (!status.ok()) {
    std::printf("pserver_health_probe: %s: RPC failed: %s (code %d)\n",
                what.c_str(), status.error_message().c_str(),
                static_cast<int>(status.error_code()));
    return 1;
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    std::printf("pserver_health_probe: %s is %s\n", what.c_str(),
                StatusName(response.status()));
    return 1;
  }
  return 0;
}
