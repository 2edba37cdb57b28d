#include "common/daemon/daemon_flags.h"

#include <cstdlib>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/daemon/process_metrics.h"

namespace pserver {

absl::StatusOr<std::shared_ptr<const CompressionSchedule>> LoadScheduleFlag(
    const std::string& path) {
  if (path.empty()) return std::shared_ptr<const CompressionSchedule>();
  absl::StatusOr<std::shared_ptr<const CompressionSchedule>> schedule =
      CompressionSchedule::Load(path);
  if (!schedule.ok()) {
    return absl::Status(schedule.status().code(),
                        absl::StrCat("--schedule: ", schedule.status().message()));
  }
  return schedule;
}

absl::StatusOr<size_t> FindFlagChoice(absl::string_view flag,
                                      absl::string_view value,
                                      absl::Span<const std::string> names) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (absl::EqualsIgnoreCase(value, names[i])) return i;
  }
  // "a", "a or b", "a, b or c".
  std::string expected;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) expected += i + 1 == names.size() ? " or " : ", ";
    expected += names[i];
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " is '", value, "'; expected ", expected));
}

absl::StatusOr<v1::Codec> ParseCodecFlag(absl::string_view flag,
                                         absl::string_view value) {
  std::vector<FlagChoice<v1::Codec>> choices;
  for (v1::Codec c : NamedCodecs()) choices.push_back({CodecName(c), c});
  return ParseEnumFlag(flag, value, choices);
}

absl::StatusOr<TransportSecurity> LoadSecurityFromFlags(
    const SecurityFlagValues& flags, TransportSecurity::Role role) {
  TransportSecurityFiles files;
  files.cert_file = flags.tls_cert;
  files.key_file = flags.tls_key;
  files.ca_file = flags.tls_ca;
  files.token_file = flags.auth_token_file;
  if (const char* env = std::getenv(kAuthTokenEnv); env != nullptr) {
    files.env_token = env;
  }
  return LoadTransportSecurity(files, role);
}

std::string SecuritySummary(const TransportSecurity& sec,
                            TransportSecurity::Role role) {
  if (!sec.tls(role)) return "plaintext";
  // A server's CA checks its clients; a client always has one, and is
  // mutual when it presents a certificate of its own.
  const bool mutual = role == TransportSecurity::kServer ? !sec.ca_pem.empty()
                                                         : !sec.cert_pem.empty();
  return absl::StrCat(mutual ? "mutual TLS" : "TLS",
                      sec.auth_token.empty() ? "" : "+token");
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& listen,
    const std::shared_ptr<prometheus::Registry>& registry) {
  if (listen.empty()) return std::unique_ptr<prometheus::Exposer>();
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb throws when the address does not parse or bind.
    exposer = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics_listen ", listen, ": cannot listen: ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  exposer->RegisterCollectable(TheProcessMetrics());
  return exposer;
}

std::string MetricsPortText(const prometheus::Exposer* exposer) {
  if (exposer == nullptr) return "off";
  std::vector<int> ports = exposer->GetListeningPorts();
  return ports.empty() ? "off" : absl::StrCat(ports.front());
}

}  // namespace pserver
