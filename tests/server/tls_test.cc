// Transport security end to end (issue 6, "Security"): a CA, server and
// client certificates and an unrelated second CA are made with the openssl
// CLI at test time; a real ShardServer serves mutual TLS + token in-process on
// port 0. Plaintext, no client certificate, a certificate of the other CA, a
// missing and a wrong token are refused; the right certificate and token work
// for raw stubs, the health service and the worker Client; the token shows
// up in neither the metrics nor stderr.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/shard_server.h"
#include "tests/server/server_test_util.h"
#include "worker/client.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::RegisterRequestFor;
using testing_util::SmallLayout;

constexpr char kToken[] = "s3cret-T0ken-4f9a1c77e2";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs a shell command in `dir`; true on exit status 0.
bool Sh(const std::string& dir, const std::string& cmd) {
  std::string full =
      absl::StrCat("cd '", dir, "' && (", cmd, ") >/dev/null 2>&1");
  return std::system(full.c_str()) == 0;
}

// A CA (name.pem/name.key) and leaf certificates signed by it, EC P-256.
bool MakeCa(const std::string& dir, const std::string& name) {
  return Sh(dir, absl::StrCat(
                     "openssl req -x509 -newkey ec -pkeyopt "
                     "ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=",
                     name, " -keyout ", name, ".key -out ", name, ".pem"));
}
bool MakeLeaf(const std::string& dir, const std::string& ca,
              const std::string& name, const std::string& ext) {
  WriteAll(dir + "/" + name + ".ext", ext);
  return Sh(dir, absl::StrCat(
                     "openssl req -new -newkey ec -pkeyopt "
                     "ec_paramgen_curve:prime256v1 -nodes -subj /CN=", name,
                     " -keyout ", name, ".key -out ", name, ".csr && ",
                     "openssl x509 -req -in ", name, ".csr -CA ", ca,
                     ".pem -CAkey ", ca, ".key -CAcreateserial -days 2 "
                     "-extfile ", name, ".ext -out ", name, ".pem"));
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/pserver_tls_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    const std::string& d = *dir_;
    ASSERT_TRUE(MakeCa(d, "ca"));
    ASSERT_TRUE(MakeCa(d, "other_ca"));
    ASSERT_TRUE(MakeLeaf(d, "ca", "server",
                         "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                         "extendedKeyUsage=serverAuth\n"));
    ASSERT_TRUE(MakeLeaf(d, "ca", "client", "extendedKeyUsage=clientAuth\n"));
    ASSERT_TRUE(MakeLeaf(d, "other_ca", "intruder",
                         "extendedKeyUsage=clientAuth\n"));
    WriteAll(d + "/token", std::string(kToken) + "\n");
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) std::system(("rm -rf '" + *dir_ + "'").c_str());
    delete dir_;
    dir_ = nullptr;
  }

  static std::string Path(const std::string& file) {
    return *dir_ + "/" + file;
  }

  void StartServer() {
    ::testing::internal::CaptureStderr();
    capturing_ = true;
    absl::StatusOr<TransportSecurity> sec = LoadTransportSecurity(
        {Path("server.pem"), Path("server.key"), Path("ca.pem"), Path("token"),
         ""},
        TransportSecurity::kServer);
    ASSERT_TRUE(sec.ok()) << sec.status();
    ASSERT_EQ(sec->auth_token, kToken);
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.security = *sec;
    ShardConfig config;
    config.num_workers = 1;
    config.optimizer.kind = OptimizerKind::kSgd;
    config.pull_codec = v1::CODEC_FP32;
    absl::StatusOr<std::unique_ptr<ShardServer>> s =
        ShardServer::Start(config, options, &registry_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(s).value();
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
    server_.reset();
    if (capturing_) {
      const std::string err = ::testing::internal::GetCapturedStderr();
      EXPECT_THAT(err, Not(HasSubstr(kToken)));
      std::fputs(err.c_str(), stderr);
    }
  }

  // TLS credentials trusting `ca`, presenting `leaf` unless empty.
  static std::shared_ptr<grpc::ChannelCredentials> Tls(
      const std::string& ca, const std::string& leaf) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadAll(Path(ca + ".pem"));
    if (!leaf.empty()) {
      o.pem_cert_chain = ReadAll(Path(leaf + ".pem"));
      o.pem_private_key = ReadAll(Path(leaf + ".key"));
    }
    return grpc::SslCredentials(o);
  }

  // Register through `creds`, adding "authorization: <auth>" unless empty.
  grpc::Status Register(std::shared_ptr<grpc::ChannelCredentials> creds,
                        const std::string& auth) {
    auto stub = v1::ParameterServer::NewStub(grpc::CreateChannel(address_, creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!auth.empty()) ctx.AddMetadata(kAuthMetadataKey, auth);
    v1::RegisterResponse resp;
    return stub->Register(
        &ctx, RegisterRequestFor(0, 1, InitialWeights(kSmallElements)), &resp);
  }

  static std::string Bearer(const std::string& t) { return "Bearer " + t; }

  static std::string* dir_;
  prometheus::Registry registry_;
  std::unique_ptr<ShardServer> server_;
  std::string address_;
  bool capturing_ = false;
};

std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, PlaintextIsRefused) {
  StartServer();
  grpc::Status s = Register(grpc::InsecureChannelCredentials(), "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // Even with the right token: the handshake fails before any metadata.
  s = Register(grpc::InsecureChannelCredentials(), Bearer(kToken));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_FALSE(server_->shard()->registered());
}

TEST_F(TlsTest, NoClientCertificateIsRefused) {
  StartServer();
  grpc::Status s = Register(Tls("ca", ""), Bearer(kToken));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_FALSE(server_->shard()->registered());
}

TEST_F(TlsTest, CertificateOfAnotherCaIsRefused) {
  StartServer();
  grpc::Status s = Register(Tls("ca", "intruder"), Bearer(kToken));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_FALSE(server_->shard()->registered());
}

TEST_F(TlsTest, ServerNotChainingToTheClientsCaIsRefused) {
  StartServer();
  grpc::Status s = Register(Tls("other_ca", "client"), Bearer(kToken));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(TlsTest, MissingOrWrongTokenIsUnauthenticated) {
  StartServer();
  const std::string near_miss = std::string(kToken) + "x";
  for (const std::string& auth :
       {std::string(), Bearer("nope"), Bearer(near_miss), std::string(kToken),
        Bearer(std::string(kToken).substr(0, 5))}) {
    grpc::Status s = Register(Tls("ca", "client"), auth);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << "auth '" << auth << "': " << s.error_message();
    EXPECT_THAT(s.error_message(), Not(HasSubstr(kToken)));
    EXPECT_THAT(s.error_message(), Not(HasSubstr("nope")));
  }
  // The health service sits behind the same check.
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address_, Tls("ca", "client")));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_EQ(health->Check(&ctx, {}, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(server_->shard()->registered());
}

TEST_F(TlsTest, RightCertificateAndTokenWork) {
  StartServer();
  grpc::Status s = Register(Tls("ca", "client"), Bearer(kToken));
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(server_->shard()->registered());

  // The same through MakeChannelCredentials (the token plugin).
  absl::StatusOr<TransportSecurity> sec = LoadTransportSecurity(
      {Path("client.pem"), Path("client.key"), Path("ca.pem"), "", kToken},
      TransportSecurity::kClient);
  ASSERT_TRUE(sec.ok()) << sec.status();
  auto channel = grpc::CreateChannel(address_, MakeChannelCredentials(*sec));
  auto stub = v1::ParameterServer::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetStatusResponse status;
  s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &status);
  EXPECT_TRUE(s.ok()) << s.error_message();

  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext hctx;
  hctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckRequest hreq;
  hreq.set_service(kServiceName);
  grpc::health::v1::HealthCheckResponse hresp;
  s = health->Check(&hctx, hreq, &hresp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(TlsTest, WorkerClientRegistersAndSteps) {
  StartServer();
  ClientOptions o;
  o.server_addresses = {address_};
  o.push_codec = v1::CODEC_FP32;
  o.rpc_timeout = absl::Seconds(10);
  o.pull_timeout = absl::Seconds(10);
  o.retry_budget = absl::Seconds(10);
  absl::StatusOr<TransportSecurity> sec = LoadTransportSecurity(
      {Path("client.pem"), Path("client.key"), Path("ca.pem"), Path("token"),
       ""},
      TransportSecurity::kClient);
  ASSERT_TRUE(sec.ok()) << sec.status();
  o.security = *sec;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> x0 = InitialWeights(kSmallElements);
  absl::Status s = (*client)->Register(SmallLayout(), x0);
  ASSERT_TRUE(s.ok()) << s;
  s = (*client)->Step(testing_util::Gradient(kSmallElements, 0, 0));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ((*client)->step(), 1u);

  // A client with the wrong token stops at once (no retries).
  o.security.auth_token = "not-the-token-7f3a";
  auto bad = Client::Connect(o);
  ASSERT_TRUE(bad.ok());
  s = (*bad)->Register(SmallLayout(), x0);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_EQ((*bad)->stats().retries, 0u);

  const std::string metrics =
      prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_THAT(metrics, HasSubstr("pserver_"));
  EXPECT_THAT(metrics, Not(HasSubstr(kToken)));
  EXPECT_THAT(metrics, Not(HasSubstr("not-the-token-7f3a")));
}

TEST(TransportSecurity, BadCombinationsNameTheFlag) {
  char tmpl[] = "/tmp/pserver_tls_flags.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string d = tmpl;
  WriteAll(d + "/cert.pem", "-----BEGIN CERTIFICATE-----\n");
  WriteAll(d + "/empty", "\n \n");
  WriteAll(d + "/token", "tok\n");
  WriteAll(d + "/bad_token", "has space\n");
  using R = TransportSecurity;
  struct Case {
    TransportSecurityFiles files;
    R::Role role;
    const char* flag;
  } cases[] = {
      {{d + "/cert.pem", "", "", "", ""}, R::kServer, "--tls_key"},
      {{"", d + "/cert.pem", "", "", ""}, R::kServer, "--tls_cert"},
      {{"", "", d + "/cert.pem", "", ""}, R::kServer, "--tls_cert"},
      {{d + "/cert.pem", d + "/cert.pem", "", "", ""}, R::kClient, "--tls_ca"},
      {{d + "/missing", d + "/cert.pem", "", "", ""}, R::kServer, "--tls_cert"},
      {{d + "/cert.pem", d + "/token", "", "", ""}, R::kServer, "--tls_key"},
      {{d + "/cert.pem", d + "/cert.pem", "", d + "/empty", ""}, R::kServer,
       "--auth_token_file"},
      {{d + "/cert.pem", d + "/cert.pem", "", d + "/missing", ""}, R::kServer,
       "--auth_token_file"},
      {{d + "/cert.pem", d + "/cert.pem", "", d + "/bad_token", ""},
       R::kServer, "--auth_token_file"},
      {{"", "", "", d + "/token", ""}, R::kServer, "--auth_token_file"},
      {{"", "", "", "", "tok"}, R::kClient, "PSERVER_AUTH_TOKEN"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TransportSecurity> s = LoadTransportSecurity(c.files, c.role);
    ASSERT_FALSE(s.ok()) << c.flag;
    EXPECT_EQ(s.status().message().find(c.flag), 0u) << s.status();
    EXPECT_EQ(s.status().message().find("tok\n"), std::string::npos);
    EXPECT_EQ(s.status().message().find("has space"), std::string::npos);
  }
  // Plaintext without a token, and an empty environment value, are fine.
  absl::StatusOr<TransportSecurity> plain =
      LoadTransportSecurity({"", "", "", "", ""}, R::kServer);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->tls(R::kServer));
  std::system(("rm -rf '" + d + "'").c_str());
}

TEST(TransportSecurity, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\0", 3), "ab"));
}

}  // namespace
}  // namespace pserver
