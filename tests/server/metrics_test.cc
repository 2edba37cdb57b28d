// A live scrape: ShardServer with a Prometheus registry and an Exposer on
// port 0, a few rounds through gRPC, then GET /metrics over a raw socket.
// The key series must be there and `promtool check metrics` must pass.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;
using testing_util::Replica;

constexpr uint64_t kN = kSmallElements;

// GET http://127.0.0.1:port/path with HTTP/1.0 (no chunking, server closes).
// Returns the body, or "" with *error set.
std::string HttpGet(int port, const std::string& path, std::string* error) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    *error = "socket failed";
    return "";
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    *error = "connect failed";
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    close(fd);
    *error = "send failed";
    return "";
  }
  std::string resp;
  char buf[4096];
  for (;;) {
    ssize_t got = recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) break;
    resp.append(buf, static_cast<size_t>(got));
  }
  close(fd);
  size_t split = resp.find("\r\n\r\n");
  const bool ok = resp.compare(0, 12, "HTTP/1.1 200") == 0 ||
                  resp.compare(0, 12, "HTTP/1.0 200") == 0;
  if (split == std::string::npos || !ok) {
    *error = "bad response: " + resp.substr(0, 200);
    return "";
  }
  return resp.substr(split + 4);
}

// The value of the first sample line that starts with `series` (name and
// labels exactly as exposed), or NaN.
double Sample(const std::string& text, const std::string& series) {
  size_t pos = 0;
  while ((pos = text.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      return std::strtod(text.c_str() + pos + series.size() + 1, nullptr);
    }
    pos += series.size();
  }
  return std::nan("");
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<prometheus::Registry>();
    exposer_ = std::make_unique<prometheus::Exposer>("127.0.0.1:0");
    exposer_->RegisterCollectable(registry_);
    ASSERT_FALSE(exposer_->GetListeningPorts().empty());
    metrics_port_ = exposer_->GetListeningPorts().front();

    ShardConfig config;
    config.num_workers = 2;
    config.optimizer.freeze_step = 100;
    config.pull_codec = v1::CODEC_ONEBIT;
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<ShardServer>> s =
        ShardServer::Start(config, options, registry_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(s).value();
    stub_ = v1::ParameterServer::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()),
        grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
  }

  template <typename Req, typename Resp, typename Method>
  grpc::Status Call(Method method, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return (stub_.get()->*method)(&ctx, req, resp);
  }

  // Two rounds of onebit pushes with delta pulls, and one rejected push.
  void RunRounds() {
    const std::vector<float> x0 = InitialWeights(kN);
    v1::RegisterResponse reg;
    for (uint32_t w = 0; w < 2; ++w) {
      ASSERT_TRUE(Call(&v1::ParameterServer::Stub::Register,
                       RegisterRequestFor(w, 2, x0), &reg)
                      .ok());
    }
    auto onebit = *MakeCodec(v1::CODEC_ONEBIT, v1::CodecParams());
    Replica replica{x0, 0};
    for (uint64_t t = 0; t < 2; ++t) {
      for (uint32_t w = 0; w < 2; ++w) {
        v1::PushRequest push = PushRequestFor(w, t, v1::EncodedTensor());
        ASSERT_TRUE(onebit->Encode(Gradient(kN, w, t), t, push.mutable_gradient()).ok());
        v1::PushResponse resp;
        grpc::Status s = Call(&v1::ParameterServer::Stub::Push, push, &resp);
        ASSERT_TRUE(s.ok()) << s.error_message();
      }
      v1::PullResponse pull;
      grpc::Status s = Call(&v1::ParameterServer::Stub::Pull,
                            PullRequestFor(0, t + 1, replica.step,
                                           ChecksumOf(replica.x)),
                            &pull);
      ASSERT_TRUE(s.ok()) << s.error_message();
      ASSERT_EQ(pull.kind(), v1::PULL_KIND_DELTA);
      ASSERT_TRUE(replica.Apply(pull));
    }
    v1::PushRequest bad = PushRequestFor(1, 2, v1::EncodedTensor());
    bad.mutable_gradient()->set_codec(v1::CODEC_ONEBIT);
    bad.mutable_gradient()->set_num_elements(kN);
    bad.mutable_gradient()->set_payload("garbage");
    v1::PushResponse resp;
    grpc::Status s = Call(&v1::ParameterServer::Stub::Push, bad, &resp);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    v1::GetStatusResponse status;
    ASSERT_TRUE(Call(&v1::ParameterServer::Stub::GetStatus,
                     v1::GetStatusRequest(), &status)
                    .ok());
  }

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int metrics_port_ = 0;
  std::unique_ptr<ShardServer> server_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

TEST_F(MetricsTest, LiveScrapeHasTheKeySeries) {
  ASSERT_NO_FATAL_FAILURE(RunRounds());
  std::string error;
  const std::string text = HttpGet(metrics_port_, "/metrics", &error);
  ASSERT_FALSE(text.empty()) << error;

  EXPECT_EQ(Sample(text, "pserver_server_step{shard=\"0\"}"), 2);
  EXPECT_EQ(Sample(text, "pserver_server_optimizer_stage{shard=\"0\"}"), 1);
  EXPECT_EQ(Sample(text, "pserver_server_workers_registered{shard=\"0\"}"), 2);
  EXPECT_EQ(Sample(text, "pserver_server_shard_elements{shard=\"0\"}"), kN);
  // Four onebit pushes of 1024 elements: 4 x (4 scales x 4 + 128) bytes.
  EXPECT_EQ(Sample(text, "pserver_server_received_payload_bytes_total{codec=\"onebit\",shard=\"0\"}"),
            4 * (4 * 4 + kN / 8));
  EXPECT_EQ(Sample(text, "pserver_server_sent_payload_bytes_total{codec=\"onebit\",shard=\"0\"}"),
            2 * (4 * 4 + kN / 8));
  EXPECT_EQ(Sample(text, "pserver_server_decoded_elements_total{shard=\"0\"}"), 4 * kN);
  EXPECT_EQ(Sample(text, "pserver_server_requests_total{code=\"OK\",method=\"Push\",shard=\"0\"}"), 4);
  EXPECT_EQ(Sample(text, "pserver_server_requests_total{code=\"OK\",method=\"Pull\",shard=\"0\"}"), 2);
  EXPECT_EQ(Sample(text, "pserver_server_requests_total{code=\"OK\",method=\"Register\",shard=\"0\"}"), 2);
  EXPECT_EQ(Sample(text, "pserver_server_requests_total{code=\"INVALID_ARGUMENT\",method=\"Push\",shard=\"0\"}"), 1);
  EXPECT_EQ(Sample(text, "pserver_server_rejected_requests_total{reason=\"invalid_payload\",shard=\"0\"}"), 1);
  EXPECT_EQ(Sample(text, "pserver_server_round_duration_seconds_count{shard=\"0\"}"), 2);
  EXPECT_EQ(Sample(text, "pserver_server_optimizer_duration_seconds_count{shard=\"0\"}"), 2);
  EXPECT_EQ(Sample(text, "pserver_server_aggregation_duration_seconds_count{shard=\"0\"}"), 4);
  EXPECT_EQ(Sample(text, "pserver_server_round_duration_seconds_bucket{shard=\"0\",le=\"+Inf\"}"), 2);
  // onebit at block 256: 32 / (1 + 32 / 256) = 28.44x in both directions.
  const double push_ratio = Sample(text, "pserver_server_compression_ratio{direction=\"push\",shard=\"0\"}");
  const double pull_ratio = Sample(text, "pserver_server_compression_ratio{direction=\"pull\",shard=\"0\"}");
  EXPECT_NEAR(push_ratio, 4096.0 / 144, 1e-3);
  EXPECT_NEAR(pull_ratio, 4096.0 / 144, 1e-3);
  EXPECT_GT(Sample(text, "pserver_server_update_norm{shard=\"0\"}"), 0);
  EXPECT_GT(Sample(text, "pserver_server_momentum_norm{shard=\"0\"}"), 0);
  EXPECT_GE(Sample(text, "pserver_server_replica_residual_norm{shard=\"0\"}"), 0);
  // A test binary links no allocator of its own: glibc's.
  EXPECT_EQ(Sample(text, "pserver_build_info{component=\"server\",malloc=\"glibc\",version=\"0.1.0\"}"),
            1);
  // Labels of low cardinality only: never a worker id.
  EXPECT_THAT(text, ::testing::Not(::testing::ContainsRegex("[{,]worker")));
}

TEST_F(MetricsTest, PromtoolCheckMetricsPassesOnALiveScrape) {
  const char* promtool = "/usr/bin/promtool";
  // tests/run.sh installs it (deploy/packages.sh, PSERVER_TEST_PACKAGES):
  // without it the exposition would go unlinted, so that is a failure.
  ASSERT_EQ(access(promtool, X_OK), 0)
      << promtool << " not found: install Debian package 'prometheus' "
      << "(tests/run.sh does) to lint the /metrics exposition";
  ASSERT_NO_FATAL_FAILURE(RunRounds());
  std::string error;
  const std::string text = HttpGet(metrics_port_, "/metrics", &error);
  ASSERT_FALSE(text.empty()) << error;

  char path[] = "/tmp/pserver_metrics_test_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  const std::string cmd =
      std::string(promtool) + " check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[512];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), p)) > 0) output.append(buf, got);
  int status = pclose(p);
  unlink(path);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << output << "\n--- scrape ---\n" << text;
  EXPECT_EQ(output, "") << "promtool reported problems:\n" << output;
}

}  // namespace
}  // namespace pserver
