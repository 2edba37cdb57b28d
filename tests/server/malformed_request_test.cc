// Requests that are not the method's message (issue 9, hole 11): refused
// INVALID_ARGUMENT naming the method and the expected type (gRPC's callback
// handler would answer UNIMPLEMENTED with an empty message), counted once,
// and logged at a bounded rate however many arrive.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rejection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/shard_server.h"
#include "tests/server/daemon_util.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using testing_util::GenericCall;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::RegisterRequestFor;

// The value of the exported sample of `name` whose labels contain every one
// of `labels` (`method="Push"`), 0 if there is none.
double Sample(prometheus::Registry& registry, const std::string& name,
              const std::vector<std::string>& labels) {
  prometheus::TextSerializer serializer;
  std::ostringstream text;
  serializer.Serialize(text, registry.Collect());
  std::istringstream lines(text.str());
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && absl::StrContains(line, l);
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

struct Method {
  const char* name;
  const char* request_type;
};
const Method kMethods[] = {
    {"Register", "pserver.v1.RegisterRequest"},
    {"Push", "pserver.v1.PushRequest"},
    {"Pull", "pserver.v1.PullRequest"},
    {"GetFrozenVariance", "pserver.v1.GetFrozenVarianceRequest"},
    {"GetStatus", "pserver.v1.GetStatusRequest"},
};

// Bytes that no message parses: a varint that never ends, a field of
// length 5 with 2 bytes, a group end tag without a start, field number 0.
const std::string kGarbage[] = {
    std::string(11, '\xff'), std::string("\x0a\x05" "ab", 4),
    std::string("\x0c", 1), std::string("\x00\x01", 2)};

TEST(ShardServer, Hole11UnparseableRequestsAreInvalidArgument) {
  prometheus::Registry registry;
  ShardConfig config;
  config.num_workers = 2;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  auto server = ShardServer::Start(config, options, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  Shard& shard = *(*server)->shard();
  ASSERT_TRUE(
      shard.Register(RegisterRequestFor(0, 2, InitialWeights(kSmallElements)))
          .ok());
  const uint64_t state = shard.Status().state_checksum();
  auto channel = grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()),
      grpc::InsecureChannelCredentials());

  for (const Method& m : kMethods) {
    const std::vector<std::string> labels = {
        absl::StrCat("method=\"", m.name, "\""), "code=\"INVALID_ARGUMENT\""};
    const double before =
        Sample(registry, "pserver_server_requests_total", labels);
    const double rejected_before =
        Sample(registry, "pserver_server_rejected_requests_total",
               {"reason=\"malformed_request\""});
    for (const std::string& garbage : kGarbage) {
      SCOPED_TRACE(absl::StrCat(m.name, " with ", garbage.size(), " bytes"));
      grpc::ByteBuffer response;
      grpc::Status s =
          GenericCall(channel, absl::StrCat("/pserver.v1.ParameterServer/",
                                            m.name),
                      Bytes(garbage), &response, absl::Seconds(10));
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat(m.name, ": ")));
      EXPECT_THAT(s.error_message(),
                  HasSubstr(absl::StrCat("request is not a valid ",
                                         m.request_type)));
    }
    // Counted once each, by method and code and by reason.
    const double n = sizeof(kGarbage) / sizeof(kGarbage[0]);
    EXPECT_EQ(Sample(registry, "pserver_server_requests_total", labels) -
                  before,
              n)
        << m.name;
    EXPECT_EQ(Sample(registry, "pserver_server_rejected_requests_total",
                     {"reason=\"malformed_request\""}) -
                  rejected_before,
              n)
        << m.name;
  }
  // The reason rides in the trailer, as for every other refusal.
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::ByteBuffer request = Bytes(kGarbage[0]);
  grpc::ByteBuffer response;
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/pserver.v1.ParameterServer/Push", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   absl::MutexLock lock(&mu);
                   status = s;
                   done = true;
                 });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto trailer = ctx.GetServerTrailingMetadata().find(kReasonTrailer);
  ASSERT_NE(trailer, ctx.GetServerTrailingMetadata().end());
  EXPECT_EQ(std::string(trailer->second.data(), trailer->second.size()),
            "REJECT_REASON_MALFORMED_REQUEST");
  // Nothing moved, and a well-formed request still works.
  EXPECT_EQ(shard.Status().state_checksum(), state);
  auto typed = v1::ParameterServer::NewStub(channel);
  grpc::ClientContext ok_ctx;
  v1::GetStatusResponse status_resp;
  EXPECT_TRUE(
      typed->GetStatus(&ok_ctx, v1::GetStatusRequest(), &status_resp).ok());
  EXPECT_TRUE(status_resp.model_registered());
  (*server)->Shutdown(absl::Seconds(1));
}

// Each Register with a tensor name that is not UTF-8 made protobuf's parser
// write one error line to stderr: a client could fill the disk of whatever
// collects the daemon's logs. Now the lines are rate-limited (10 per 10 s,
// then one "suppressed" line).
TEST(ShardServer, Hole11InvalidUtf8NamesAreRefusedAndLoggedBoundedly) {
  constexpr int kRequests = 1000;
  testing_util::Daemon daemon({"--num_workers=2"});
  ASSERT_GT(daemon.port(), 0) << testing::ReadFile(daemon.log_path());
  // A valid RegisterRequest whose tensor name "@@@@" becomes 4 bytes that
  // are not UTF-8 (same length, so the framing stays valid).
  v1::RegisterRequest r =
      RegisterRequestFor(0, 2, InitialWeights(kSmallElements));
  r.mutable_layout()->mutable_tensors(0)->set_name("@@@@");
  std::string bytes = r.SerializeAsString();
  const size_t at = bytes.find("@@@@");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 4, "\xff\xfe\xc0\x80");
  const std::string log_before = testing::ReadFile(daemon.log_path());

  auto channel = daemon.Channel(0);
  const absl::Time start = absl::Now();
  int refused = 0;
  std::string first_message;
  for (int i = 0; i < kRequests; ++i) {
    grpc::ByteBuffer response;
    grpc::Status s =
        GenericCall(channel, "/pserver.v1.ParameterServer/Register",
                    Bytes(bytes), &response, absl::Seconds(10));
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) ++refused;
    if (i == 0) first_message = s.error_message();
  }
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(refused, kRequests);
  EXPECT_THAT(first_message,
              HasSubstr("Register: request is not a valid "
                        "pserver.v1.RegisterRequest"));
  ASSERT_TRUE(testing_util::Healthy(daemon));

  const std::string log =
      testing::ReadFile(daemon.log_path()).substr(log_before.size());
  int utf8_lines = 0;
  int lines = 0;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    ++lines;
    if (absl::StrContains(line, "invalid UTF-8")) ++utf8_lines;
  }
  std::printf("[ measured ] %d requests with invalid UTF-8 names in %s: %d "
              "stderr lines (%d naming the UTF-8 error)\n",
              kRequests, absl::FormatDuration(elapsed).c_str(), lines,
              utf8_lines);
  // The first is logged; then at most 10 lines plus one summary per 10 s
  // interval that the run touched.
  EXPECT_GE(utf8_lines, 1) << log;
  const int intervals = static_cast<int>(elapsed / absl::Seconds(10)) + 1;
  EXPECT_LE(lines, 11 * intervals) << log;
}

}  // namespace
}  // namespace pserver
