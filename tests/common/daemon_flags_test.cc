// common/daemon: the pieces the three mains share. The daemons' own
// behaviour (exit codes, one stderr line) is checked from the outside by
// tests/worker/worker_cli_test.sh, tests/server/daemon_test.sh and
// tests/server/health_probe_cli_test.sh.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "common/codec.h"
#include "common/daemon/command_line.h"
#include "common/daemon/daemon_flags.h"
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
