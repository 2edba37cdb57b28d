// Turning the daemons' flag values into objects, once for pserver_server,
// pserver_worker and pserver_health_probe: enum flags with one error format,
// transport security from the TLS flags, and the Prometheus exposer. The
// flags stay defined in each main.cc (their help and defaults differ by
// role); these functions take the values.
//
//   absl::StatusOr<bool> robust = ParseEnumFlag<bool>(
//       "onebit_mode", absl::GetFlag(FLAGS_onebit_mode),
//       {{"robust", true}, {"deepspeed", false}});
//   if (!robust.ok()) return Fail(robust.status().message());
//   // "--onebit_mode is 'fast'; expected robust or deepspeed"
#ifndef PSERVER_COMMON_DAEMON_DAEMON_FLAGS_H_
#define PSERVER_COMMON_DAEMON_DAEMON_FLAGS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/schedule.h"
#include "common/tls.h"
#include "pserver/v1/codec.pb.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace pserver {

// One accepted spelling of an enum flag and what it means.
template <typename T>
struct FlagChoice {
  std::string name;
  T value;
};

// The position of `value` among `names` (ASCII case-insensitive); otherwise
// INVALID_ARGUMENT "--<flag> is '<value>'; expected a, b or c".
absl::StatusOr<size_t> FindFlagChoice(absl::string_view flag,
                                      absl::string_view value,
                                      absl::Span<const std::string> names);

// The value `value` names among `choices`; errors as FindFlagChoice. `flag`
// is the flag's name without dashes.
template <typename T>
absl::StatusOr<T> ParseEnumFlag(absl::string_view flag,
                                absl::string_view value,
                                const std::vector<FlagChoice<T>>& choices) {
  std::vector<std::string> names;
  names.reserve(choices.size());
  for (const FlagChoice<T>& c : choices) names.push_back(c.name);
  absl::StatusOr<size_t> i = FindFlagChoice(flag, value, names);
  if (!i.ok()) return i.status();
  return choices[*i].value;
}

// A codec flag ("fp32", "onebit", ...; common/codec.h's names).
absl::StatusOr<v1::Codec> ParseCodecFlag(absl::string_view flag,
                                         absl::string_view value);

// Transport security from the TLS flags' values (paths as given, empty when
// unset) and, when token_file is empty, PSERVER_AUTH_TOKEN from the
// environment. Errors as LoadTransportSecurity's: the message starts with
// the flag at fault ("--tls_key: ...") and never holds a secret.
struct SecurityFlagValues {
  std::string tls_cert;         // --tls_cert
  std::string tls_key;          // --tls_key
  std::string tls_ca;           // --tls_ca
  std::string auth_token_file;  // --auth_token_file
};
// --schedule's value: the compression schedule at `path` (common/schedule.h),
// or null for an empty path (no schedule). Errors start with "--schedule: ".
absl::StatusOr<std::shared_ptr<const CompressionSchedule>> LoadScheduleFlag(
    const std::string& path);

absl::StatusOr<TransportSecurity> LoadSecurityFromFlags(
    const SecurityFlagValues& flags, TransportSecurity::Role role);

// What is on, for a start-up line: "plaintext", "TLS", "mutual TLS",
// "TLS+token" or "mutual TLS+token". Never a secret.
std::string SecuritySummary(const TransportSecurity& sec,
                            TransportSecurity::Role role);

// Serves `registry` and the process metrics (process_metrics.h: CPU
// seconds, resident memory, faults) on http://<listen>/metrics. Null
// (metrics off) when `listen` is empty; UNAVAILABLE "--metrics_listen
// <listen>: cannot listen: <why>" when it does not bind. The caller (main)
// owns the exposer and keeps it for the life of the process.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& listen,
    const std::shared_ptr<prometheus::Registry>& registry);

// The bound metrics port as text, or "off" for a null exposer.
std::string MetricsPortText(const prometheus::Exposer* exposer);

}  // namespace pserver

#endif  // PSERVER_COMMON_DAEMON_DAEMON_FLAGS_H_
