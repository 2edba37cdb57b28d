#include "common/tls.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace pserver {
namespace {

// The whole file, or an error prefixed with `flag`; never the contents.
absl::StatusOr<std::string> ReadFile(const std::string& flag,
                                     const std::string& path) {
  absl::StatusOr<std::string> data = ReadFileToString(path);
  if (data.ok()) return data;
  // Unreadable credentials are a configuration error unless the file is
  // missing or forbidden.
  absl::StatusCode code = data.status().code();
  if (code != absl::StatusCode::kNotFound &&
      code != absl::StatusCode::kPermissionDenied) {
    code = absl::StatusCode::kInvalidArgument;
  }
  return absl::Status(code, absl::StrCat(flag, ": cannot read ",
                                         data.status().message()));
}

absl::Status CheckToken(const std::string& source, absl::string_view token) {
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the token is empty; expected a shared secret"));
  }
  for (char c : token) {
    // Metadata values must be printable ASCII; the token itself is not shown.
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the token has a character outside printable ASCII "
                  "(0x21..0x7e)"));
    }
  }
  return absl::OkStatus();
}

std::string BearerValue(absl::string_view token) {
  return absl::StrCat("Bearer ", token);
}

// Runs in the transport before any handler: accepts a call iff it carries
// exactly one "authorization: Bearer <token>", which it consumes so that
// handlers never see it. Thread-safe (immutable after construction).
class TokenProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::string token)
      : expected_(BearerValue(token)) {}

  // A constant-time compare and no I/O: run it inline.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    auto [begin, end] = auth_metadata.equal_range(kAuthMetadataKey);
    int count = 0;
    bool ok = false;
    for (auto it = begin; it != end; ++it) {
      ++count;
      ok = ConstantTimeEquals(
          absl::string_view(it->second.data(), it->second.size()), expected_);
    }
    if (count != 1 || !ok) {
      // Never echo what was sent: it may be a near miss of the secret.
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          count == 0 ? "missing auth token: expected metadata "
                                       "'authorization: Bearer <token>'"
                                     : "wrong auth token");
    }
    consumed_auth_metadata->insert(
        {std::string(kAuthMetadataKey),
         std::string(begin->second.data(), begin->second.size())});
    return grpc::Status::OK;
  }

 private:
  const std::string expected_;
};

// Adds the token to every call of a channel. Thread-safe (immutable).
class TokenPlugin : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(std::string token) : value_(BearerValue(token)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "pserver-token"; }
  grpc::Status GetMetadata(
      grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
      const grpc::AuthContext& /*channel_auth_context*/,
      std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({kAuthMetadataKey, value_});
    return grpc::Status::OK;
  }
  grpc::string DebugString() override { return "pserver bearer token"; }

 private:
  const std::string value_;
};

}  // namespace

bool ConstantTimeEquals(absl::string_view given, absl::string_view expected) {
  // Walk `expected` whole whatever `given` holds, OR-ing the differences:
  // no early exit tells a caller how many leading bytes were right.
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g =
        i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

absl::StatusOr<TransportSecurity> LoadTransportSecurity(
    const TransportSecurityFiles& files, TransportSecurity::Role role) {
  const bool server = role == TransportSecurity::kServer;
  if (!files.cert_file.empty() && files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_key: empty while --tls_cert is set; expected the certificate's "
        "private key");
  }
  if (files.cert_file.empty() && !files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert: empty while --tls_key is set; expected the key's "
        "certificate");
  }
  if (server && !files.ca_file.empty() && files.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert: empty while --tls_ca is set; mutual TLS needs the "
        "server's own --tls_cert and --tls_key");
  }
  if (!server && !files.cert_file.empty() && files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca: empty while --tls_cert is set; expected the CA that the "
        "server's certificate chains to");
  }
  TransportSecurity sec;
  for (auto [flag, path, out] :
       {std::tuple{"--tls_cert", &files.cert_file, &sec.cert_pem},
        std::tuple{"--tls_key", &files.key_file, &sec.key_pem},
        std::tuple{"--tls_ca", &files.ca_file, &sec.ca_pem}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> pem = ReadFile(flag, *path);
    if (!pem.ok()) return pem.status();
    if (pem->find("-----BEGIN ") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", *path, " holds no PEM block"));
    }
    *out = *std::move(pem);
  }
  std::string source;
  if (!files.token_file.empty()) {
    source = "--auth_token_file";
    absl::StatusOr<std::string> token =
        ReadFile("--auth_token_file", files.token_file);
    if (!token.ok()) return token.status();
    sec.auth_token = std::string(absl::StripAsciiWhitespace(*token));
  } else if (!files.env_token.empty()) {
    source = kAuthTokenEnv;
    sec.auth_token = std::string(absl::StripAsciiWhitespace(files.env_token));
  }
  if (!source.empty()) {
    if (absl::Status s = CheckToken(source, sec.auth_token); !s.ok()) return s;
    if (!sec.tls(role)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": a token needs TLS (",
          server ? "--tls_cert and --tls_key" : "--tls_ca",
          "); it would cross the network in plaintext"));
    }
  }
  return sec;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TransportSecurity& sec) {
  if (!sec.tls(TransportSecurity::kServer)) {
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(
      sec.ca_pem.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = sec.ca_pem;
  options.pem_key_cert_pairs.push_back({sec.key_pem, sec.cert_pem});
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::SslServerCredentials(options);
  if (!sec.auth_token.empty()) {
    creds->SetAuthMetadataProcessor(
        std::make_shared<TokenProcessor>(sec.auth_token));
  }
  return creds;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const TransportSecurity& sec) {
  if (!sec.tls(TransportSecurity::kClient)) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = sec.ca_pem;
  options.pem_private_key = sec.key_pem;
  options.pem_cert_chain = sec.cert_pem;
  std::shared_ptr<grpc::ChannelCredentials> creds =
      grpc::SslCredentials(options);
  if (sec.auth_token.empty()) return creds;
  return grpc::CompositeChannelCredentials(
      creds, grpc::MetadataCredentialsFromPlugin(
                 std::make_unique<TokenPlugin>(sec.auth_token)));
}

}  // namespace pserver
