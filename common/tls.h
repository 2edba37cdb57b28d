// Transport security shared by the shard server, the worker client and the
// health probe: TLS, optional mutual TLS, and a shared bearer token.
//
// Server: --tls_cert/--tls_key turn on TLS; --tls_ca additionally requires
// every client to present a certificate that chains to that CA
// (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY). Client:
// --tls_ca turns on TLS and is the CA the server's certificate must chain
// to; --tls_cert/--tls_key are its own certificate for mutual TLS.
//
// Token: read from --auth_token_file (never a flag value, so it does not show
// in `ps`) or else from the environment variable PSERVER_AUTH_TOKEN. Sent as
// "authorization: Bearer <token>" on every call; the server checks it in a
// grpc::AuthMetadataProcessor, which runs before any handler (the health
// service included) and strips the header, so handlers never see it. A token
// requires TLS: AuthMetadataProcessor only attaches to secure credentials in
// gRPC 1.51, server interceptors there cannot fail a call before its handler,
// and a bearer token on a plaintext connection can be read off the wire.
//
// Usage:
//   absl::StatusOr<TransportSecurity> sec = LoadTransportSecurity(
//       {.cert_file = "s.pem", .key_file = "s.key", .ca_file = "ca.pem",
//        .token_file = "token"}, TransportSecurity::kServer);
//   builder.AddListeningPort(addr, *MakeServerCredentials(*sec));
#ifndef PSERVER_COMMON_TLS_H_
#define PSERVER_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace pserver {

// The metadata key the token travels in; the value is "Bearer <token>".
inline constexpr char kAuthMetadataKey[] = "authorization";
// Environment variable consulted when no --auth_token_file is given.
inline constexpr char kAuthTokenEnv[] = "PSERVER_AUTH_TOKEN";

// PEM contents, not paths. All empty: plaintext, no token.
struct TransportSecurity {
  enum Role { kServer, kClient };
  std::string cert_pem;  // own certificate chain
  std::string key_pem;   // its private key
  // Server: CA that client certificates must chain to (mutual TLS).
  // Client: CA that the server certificate must chain to.
  std::string ca_pem;
  // Shared secret; never logged, never in a metric or an error message.
  std::string auth_token;

  bool tls(Role role) const {
    return role == kServer ? !cert_pem.empty() : !ca_pem.empty();
  }
};

// What the daemons' flags name. Paths, so secrets stay out of argv.
struct TransportSecurityFiles {
  std::string cert_file;   // --tls_cert
  std::string key_file;    // --tls_key
  std::string ca_file;     // --tls_ca
  std::string token_file;  // --auth_token_file
  // Value of PSERVER_AUTH_TOKEN, used when token_file is empty; empty means
  // unset (so an empty line in a Compose env file does not fail the start).
  std::string env_token;
};

// Reads the files and checks the combination for `role`. INVALID_ARGUMENT
// with a message that starts with the offending flag ("--tls_key: ...") for
// a certificate without its key (or the reverse), a client certificate
// without --tls_ca, a server CA without a certificate, a token without TLS,
// an empty or non-printable token; NOT_FOUND / PERMISSION_DENIED (same
// prefix) for an unreadable file. Messages name paths, never contents.
absl::StatusOr<TransportSecurity> LoadTransportSecurity(
    const TransportSecurityFiles& files, TransportSecurity::Role role);

// Insecure credentials when !sec.tls(kServer); otherwise TLS, mutual when
// sec.ca_pem is set, and with the token check installed when
// sec.auth_token is set.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TransportSecurity& sec);

// Insecure credentials when !sec.tls(kClient); otherwise TLS verifying the
// server against sec.ca_pem, presenting cert/key when set, and attaching
// the token to every call when sec.auth_token is set.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const TransportSecurity& sec);

// Equal contents, in time that depends only on expected.size().
bool ConstantTimeEquals(absl::string_view given, absl::string_view expected);

}  // namespace pserver

#endif  // PSERVER_COMMON_TLS_H_
