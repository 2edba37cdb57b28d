// common/daemon: the pieces the three mains share. The daemons' own
// behaviour (exit codes, one stderr line) is checked from the outside by
// tests/worker/worker_cli_test.sh, tests/server/daemon_test.sh and
// tests/server/health_probe_cli_test.sh.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/daemon/command_line.h"
#include "common/daemon/daemon_flags.h"
#include "common/daemon/process_metrics.h"
#include "common/process_stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int32_t, daemon_flags_test_answer, 42, "a flag of this file");
ABSL_FLAG(std::string, daemon_flags_test_name, "", "another flag of it");

namespace pserver {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

enum class Mode { kRobust, kDeepSpeed };

TEST(EnumFlag, ParsesEachChoiceInAnyCase) {
  const std::vector<FlagChoice<Mode>> choices = {{"robust", Mode::kRobust},
                                                 {"deepspeed", Mode::kDeepSpeed}};
  EXPECT_EQ(*ParseEnumFlag("onebit_mode", "robust", choices), Mode::kRobust);
  EXPECT_EQ(*ParseEnumFlag("onebit_mode", "DeepSpeed", choices),
            Mode::kDeepSpeed);
}

TEST(EnumFlag, ErrorNamesTheFlagTheValueAndEveryChoice) {
  absl::StatusOr<Mode> m = ParseEnumFlag<Mode>(
      "onebit_mode", "fast",
      {{"robust", Mode::kRobust}, {"deepspeed", Mode::kDeepSpeed}});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.status().message(),
            "--onebit_mode is 'fast'; expected robust or deepspeed");
  absl::StatusOr<int> three = ParseEnumFlag<int>(
      "progress", "", {{"auto", 0}, {"bar", 1}, {"lines", 2}});
  EXPECT_EQ(three.status().message(),
            "--progress is ''; expected auto, bar or lines");
  absl::StatusOr<int> one = ParseEnumFlag<int>("x", "b", {{"a", 0}});
  EXPECT_EQ(one.status().message(), "--x is 'b'; expected a");
}

TEST(EnumFlag, CodecFlagAcceptsEveryNamedCodecAndListsThem) {
  for (v1::Codec c : NamedCodecs()) {
    absl::StatusOr<v1::Codec> parsed = ParseCodecFlag("push_codec", CodecName(c));
    ASSERT_TRUE(parsed.ok()) << CodecName(c);
    EXPECT_EQ(*parsed, c);
  }
  absl::StatusOr<v1::Codec> bad = ParseCodecFlag("pull_codec", "zip");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--pull_codec is 'zip'; expected fp32, fp16, bf16, onebit, topk, "
            "randomk, quantize, topk_quantize or block_topk");
}

TEST(SecurityFlags, SummaryNamesWhatIsOnForEachRole) {
  TransportSecurity plain;
  EXPECT_EQ(SecuritySummary(plain, TransportSecurity::kServer), "plaintext");
  EXPECT_EQ(SecuritySummary(plain, TransportSecurity::kClient), "plaintext");
  TransportSecurity server;
  server.cert_pem = "c";
  server.key_pem = "k";
  EXPECT_EQ(SecuritySummary(server, TransportSecurity::kServer), "TLS");
  server.ca_pem = "ca";
  server.auth_token = "secret";
  EXPECT_EQ(SecuritySummary(server, TransportSecurity::kServer),
            "mutual TLS+token");
  TransportSecurity client;
  client.ca_pem = "ca";
  EXPECT_EQ(SecuritySummary(client, TransportSecurity::kClient), "TLS");
  client.cert_pem = "c";
  EXPECT_EQ(SecuritySummary(client, TransportSecurity::kClient), "mutual TLS");
  EXPECT_THAT(SecuritySummary(server, TransportSecurity::kServer),
              Not(HasSubstr("secret")));
}

TEST(SecurityFlags, ErrorsNameTheFlagAndTheEnvironmentTokenIsRead) {
  absl::StatusOr<TransportSecurity> s =
      LoadSecurityFromFlags({"/nonexistent.pem", "", "", ""},
                            TransportSecurity::kServer);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StartsWith(s.status().message(), "--tls_key"))
      << s.status().message();
  // No token file: PSERVER_AUTH_TOKEN counts, and a token needs TLS.
  setenv(kAuthTokenEnv, "secret", 1);
  s = LoadSecurityFromFlags({}, TransportSecurity::kClient);
  unsetenv(kAuthTokenEnv);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(kAuthTokenEnv));
  EXPECT_THAT(s.status().message(), Not(HasSubstr("secret")));
  EXPECT_TRUE(LoadSecurityFromFlags({}, TransportSecurity::kClient).ok());
}

TEST(MetricsFlags, EmptyAddressIsOffAndABadOneNamesTheFlag) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> off =
      ServeMetrics("", registry);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, nullptr);
  EXPECT_EQ(MetricsPortText(off->get()), "off");
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> bad =
      ServeMetrics("bogus", registry);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StartsWith(bad.status().message(),
                               "--metrics_listen bogus: cannot listen"));
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> on =
      ServeMetrics("127.0.0.1:0", registry);
  ASSERT_TRUE(on.ok()) << on.status();
  const std::string port = MetricsPortText(on->get());
  EXPECT_NE(port, "off");
  EXPECT_GT(std::atoi(port.c_str()), 0);
}

// The families by name, with their one sample's value.
std::map<std::string, double> Collected() {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : TheProcessMetrics()->Collect()) {
    EXPECT_EQ(f.metric.size(), 1u) << f.name;
    if (f.metric.empty()) continue;
    out[f.name] = f.type == prometheus::MetricType::Counter
                      ? f.metric[0].counter.value
                      : f.metric[0].gauge.value;
  }
  return out;
}

TEST(ProcessMetrics, CpuMemoryFaultsStartAndDescriptorsOfThisProcess) {
  const std::map<std::string, double> before = Collected();
  for (const char* name :
       {"process_cpu_seconds_total", "process_resident_memory_bytes",
        "process_start_time_seconds", "process_open_fds",
        "pserver_process_minor_page_faults_total",
        "pserver_process_peak_resident_memory_bytes"}) {
    EXPECT_EQ(before.count(name), 1u) << name;
  }
  // 64 MiB touched page by page: more resident memory, more faults, and CPU
  // time spent (a busy loop until the counter moves).
  std::vector<char> big(64 << 20);
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = 1;
  const double cpu0 = ReadProcessUsage().cpu_seconds;
  volatile double sink = 0;
  while (ReadProcessUsage().cpu_seconds < cpu0 + 0.02) sink = sink + 1.0;
  const std::map<std::string, double> after = Collected();
  EXPECT_GT(after.at("process_cpu_seconds_total"),
            before.at("process_cpu_seconds_total"));
  EXPECT_GE(after.at("pserver_process_minor_page_faults_total"),
            before.at("pserver_process_minor_page_faults_total") + 10000);
  EXPECT_GE(after.at("process_resident_memory_bytes"), 64.0 * (1 << 20));
  // The kernel syncs its per-thread RSS counters in batches: the two
  // readings differ by a few hundred KiB, so compare with what was touched.
  EXPECT_GE(after.at("pserver_process_peak_resident_memory_bytes"),
            64.0 * (1 << 20));
  const double now = absl::ToUnixSeconds(absl::Now());
  EXPECT_LE(after.at("process_start_time_seconds"), now + 1);
  EXPECT_GT(after.at("process_start_time_seconds"), now - 3600);
  EXPECT_GE(after.at("process_open_fds"), 3);  // stdin, stdout, stderr
  EXPECT_EQ(big[4096], 1);
}

// What ServeMetrics serves: the registry's metrics and the process's.
TEST(MetricsFlags, TheMetricsPageHasTheProcessMetrics) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> on =
      ServeMetrics("127.0.0.1:0", registry);
  ASSERT_TRUE(on.ok()) << on.status();
  const int port = (*on)->GetListeningPorts().front();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string get =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(write(fd, get.data(), get.size()),
            static_cast<ssize_t>(get.size()));
  std::string page;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) page.append(buf, n);
  close(fd);
  EXPECT_THAT(page, HasSubstr("\nprocess_cpu_seconds_total "));
  EXPECT_THAT(page, HasSubstr("\nprocess_resident_memory_bytes "));
  EXPECT_THAT(page, HasSubstr("\npserver_process_minor_page_faults_total "));
}

TEST(CommandLine, HelpListsTheFlagsOfTheGivenFileOnly) {
  const std::string help = DaemonHelpText("usage line", __FILE__);
  EXPECT_TRUE(absl::StartsWith(help, "usage line\n\nFlags:\n")) << help;
  EXPECT_THAT(help, HasSubstr("  --daemon_flags_test_answer (a flag of this "
                              "file); default: 42;\n"));
  EXPECT_THAT(help, HasSubstr("  --daemon_flags_test_name (another flag of "
                              "it); default: \"\";\n"));
  // Sorted by name; nothing from other files (gtest's flags are not absl's,
  // absl's own --flagfile lives in absl).
  EXPECT_LT(help.find("daemon_flags_test_answer"),
            help.find("daemon_flags_test_name"));
  EXPECT_THAT(help, Not(HasSubstr("--flagfile")));
  // absl strips leading slashes from a flag's file; either spelling works.
  EXPECT_EQ(DaemonHelpText("u", std::string("//") + __FILE__),
            DaemonHelpText("u", __FILE__));
}

}  // namespace
}  // namespace pserver
