// The gRPC service end to end: a real ShardServer in-process on port 0, real
// channels and stubs. Multi-worker rounds from threads, waiting pulls,
// deadlines, health checking, and the bad-input list of issue 3, each case
// checked for its exact code, a message naming the field, and a state that is
// byte-for-byte unchanged.
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/grpc_status.h"
#include "common/rejection.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using testing_util::DecodeAll;
using testing_util::Fp32Tensor;
using testing_util::OneBitAdamConfig;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;
using testing_util::Replica;

constexpr uint64_t kN = kSmallElements;

v1::EncodedTensor OneBit(absl::Span<const float> g, uint64_t seed = 1) {
  auto codec = MakeCodec(v1::CODEC_ONEBIT, v1::CodecParams());
  EXPECT_TRUE(codec.ok()) << codec.status();
  v1::EncodedTensor t;
  absl::Status s = (*codec)->Encode(g, seed, &t);
  EXPECT_TRUE(s.ok()) << s;
  return t;
}

std::shared_ptr<grpc::Channel> MakeChannel(int port, int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(max_message_bytes);
  args.SetMaxReceiveMessageSize(max_message_bytes);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

class ServiceTest : public ::testing::Test {
 protected:
  void Start(const ShardConfig& config, int max_message_bytes = 1 << 30) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.max_message_bytes = max_message_bytes;
    absl::StatusOr<std::unique_ptr<ShardServer>> s =
        ShardServer::Start(config, options, nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(s).value();
    ASSERT_GT(server_->port(), 0);
    // The client may send far more than the server accepts.
    channel_ = MakeChannel(server_->port(), 256 << 20);
    stub_ = v1::ParameterServer::NewStub(channel_);
  }

  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
  }

  grpc::Status Register(const v1::RegisterRequest& req,
                        v1::RegisterResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::RegisterResponse ignored;
    return stub_->Register(&ctx, req, resp ? resp : &ignored);
  }
  grpc::Status Push(const v1::PushRequest& req, v1::PushResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::PushResponse ignored;
    return stub_->Push(&ctx, req, resp ? resp : &ignored);
  }
  grpc::Status Pull(const v1::PullRequest& req, v1::PullResponse* resp,
                    absl::Duration deadline = absl::Seconds(10)) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, deadline);
    return stub_->Pull(&ctx, req, resp);
  }
  v1::GetStatusResponse Status() {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::GetStatusResponse resp;
    grpc::Status s = stub_->GetStatus(&ctx, v1::GetStatusRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  // grpc.health.v1.Health/Check through the generic stub, with the request
  // and response hand-encoded (no generated health proto ships in Debian).
  // Returns the ServingStatus number (1 SERVING, 2 NOT_SERVING) or -code.
  int HealthCheck(const std::string& service) {
    std::string req;
    if (!service.empty()) {
      req.push_back(0x0A);  // field 1, length-delimited
      req.push_back(static_cast<char>(service.size()));
      req += service;
    }
    grpc::Slice slice(req);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                      &request, &response,
                      [&done](grpc::Status s) { done.set_value(s); });
    grpc::Status s = done.get_future().get();
    if (!s.ok()) return -static_cast<int>(s.error_code());
    grpc::Slice out;
    if (!response.DumpToSingleSlice(&out).ok()) return -1000;
    std::string bytes(reinterpret_cast<const char*>(out.begin()), out.size());
    if (bytes.empty()) return 0;  // UNKNOWN, the proto3 default
    if (bytes.size() != 2 || bytes[0] != 0x08) return -1001;
    return bytes[1];
  }

  std::unique_ptr<ShardServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

// One fake worker: error feedback over the onebit codec, preconditioning
// with the frozen variance after the freeze, replica tracking on pulls.
struct FakeWorker {
  uint32_t id;
  std::unique_ptr<v1::ParameterServer::Stub> stub;
  std::unique_ptr<Codec> codec;
  std::vector<float> error;
  std::vector<float> inverse_precond;  // 1 / (sqrt(v) + eps) after the freeze
  Replica replica;
  std::vector<v1::PushRequest> sent;

  void Run(uint32_t num_workers, uint64_t steps, uint64_t freeze_step,
           const std::vector<float>& x0) {
    codec = *MakeCodec(v1::CODEC_ONEBIT, v1::CodecParams());
    error.assign(kN, 0.0f);
    {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, absl::Seconds(10));
      v1::RegisterResponse resp;
      // Every worker offers the initial weights; whoever comes first sets them.
      grpc::Status s =
          stub->Register(&ctx, RegisterRequestFor(id, num_workers, x0), &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
      ASSERT_EQ(resp.shard_end() - resp.shard_begin(), kN);
      replica = Replica{x0, static_cast<int64_t>(resp.current_step())};
    }
    for (uint64_t t = 0; t < steps; ++t) {
      std::vector<float> g = Gradient(kN, id, t);
      v1::GradientSpace space = v1::GRADIENT_SPACE_RAW;
      if (t >= freeze_step) {
        if (inverse_precond.empty()) {
          grpc::ClientContext ctx;
          SetDeadline(&ctx, absl::Seconds(10));
          v1::GetFrozenVarianceRequest req;
          req.set_worker_id(id);
          v1::GetFrozenVarianceResponse resp;
          grpc::Status s = stub->GetFrozenVariance(&ctx, req, &resp);
          ASSERT_TRUE(s.ok()) << s.error_message();
          std::vector<float> v = DecodeAll(resp.variance());
          ASSERT_EQ(v.size(), kN);
          for (float vi : v) inverse_precond.push_back(1.0f / (std::sqrt(vi) + resp.eps()));
        }
        for (uint64_t i = 0; i < kN; ++i) g[i] *= inverse_precond[i];
        space = v1::GRADIENT_SPACE_PRECONDITIONED;
      }
      v1::PushRequest push;
      push.set_worker_id(id);
      push.set_step(t);
      push.set_space(space);
      std::vector<float> next_error(kN);
      absl::Status es = EncodeWithFeedback(
          *codec, g, error, 1.0f, id * 1000 + t, push.mutable_gradient(),
          absl::MakeSpan(next_error));
      ASSERT_TRUE(es.ok()) << es;
      error.swap(next_error);
      {
        grpc::ClientContext ctx;
        SetDeadline(&ctx, absl::Seconds(20));
        v1::PushResponse resp;
        grpc::Status s = stub->Push(&ctx, push, &resp);
        ASSERT_TRUE(s.ok()) << "worker " << id << " step " << t << ": "
                            << s.error_message();
        ASSERT_FALSE(resp.duplicate());
      }
      sent.push_back(push);
      {
        grpc::ClientContext ctx;
        SetDeadline(&ctx, absl::Seconds(20));
        v1::PullResponse resp;
        grpc::Status s = stub->Pull(
            &ctx, PullRequestFor(id, t + 1, replica.step, ChecksumOf(replica.x)),
            &resp);
        ASSERT_TRUE(s.ok()) << "worker " << id << " pull " << t + 1 << ": "
                            << s.error_message();
        ASSERT_EQ(resp.kind(), v1::PULL_KIND_DELTA) << "step " << t + 1;
        ASSERT_TRUE(replica.Apply(resp));
        ASSERT_EQ(ChecksumOf(replica.x), resp.replica_checksum())
            << "worker " << id << " step " << t + 1;
      }
    }
  }
};

TEST_F(ServiceTest, FourWorkersTwentyStepsFromThreadsMatchTheShardAlone) {
  const uint32_t kWorkers = 4;
  const uint64_t kSteps = 20, kFreeze = 8;
  const ShardConfig config = OneBitAdamConfig(kWorkers, kFreeze);
  ASSERT_NO_FATAL_FAILURE(Start(config));
  const std::vector<float> x0 = InitialWeights(kN);

  std::vector<FakeWorker> workers(kWorkers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    workers[w].id = w;
    // A channel each, as separate processes would have.
    workers[w].stub =
        v1::ParameterServer::NewStub(MakeChannel(server_->port(), 64 << 20));
    threads.emplace_back(
        [&, w] { workers[w].Run(kWorkers, kSteps, kFreeze, x0); });
  }
  for (std::thread& t : threads) t.join();
  if (HasFailure()) return;

  v1::GetStatusResponse st = Status();
  EXPECT_EQ(st.current_step(), kSteps);
  EXPECT_EQ(st.stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  EXPECT_EQ(st.workers_registered(), kWorkers);
  EXPECT_EQ(st.pushes_pending(), 0u);
  for (const FakeWorker& w : workers) {
    EXPECT_EQ(ChecksumOf(w.replica.x), st.replica_checksum()) << "worker " << w.id;
  }

  // The same pushes fed to a Shard directly, in worker-id order, give the
  // same state bit for bit: arrival order and threads made no difference.
  absl::StatusOr<std::unique_ptr<Shard>> ref = Shard::Create(config, nullptr);
  ASSERT_TRUE(ref.ok());
  for (uint32_t w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE((*ref)->Register(RegisterRequestFor(w, kWorkers, x0)).ok());
  }
  for (uint64_t t = 0; t < kSteps; ++t) {
    for (uint32_t w = 0; w < kWorkers; ++w) {
      ASSERT_TRUE((*ref)->Push(workers[w].sent[t]).ok());
    }
  }
  EXPECT_EQ((*ref)->Status().state_checksum(), st.state_checksum());
  EXPECT_EQ((*ref)->Status().replica_checksum(), st.replica_checksum());
}

TEST_F(ServiceTest, PullOfTheNextStepWaitsForTheRound) {
  ASSERT_NO_FATAL_FAILURE(Start(OneBitAdamConfig(2, 100)));
  const std::vector<float> x0 = InitialWeights(kN);
  ASSERT_TRUE(Register(RegisterRequestFor(0, 2, x0)).ok());
  ASSERT_TRUE(Register(RegisterRequestFor(1, 2, x0)).ok());
  ASSERT_TRUE(Push(PushRequestFor(0, 0, OneBit(Gradient(kN, 0, 0)))).ok());

  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(20));
  v1::PullRequest req = PullRequestFor(0, 1, 0, ChecksumOf(x0));
  v1::PullResponse resp;
  absl::Notification done;
  grpc::Status status;
  stub_->async()->Pull(&ctx, &req, &resp, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  // Half a round is not a round.
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  ASSERT_TRUE(Push(PushRequestFor(1, 0, OneBit(Gradient(kN, 1, 0)))).ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(resp.step(), 1u);
  EXPECT_EQ(resp.kind(), v1::PULL_KIND_DELTA);
  Replica replica{x0, 0};
  ASSERT_TRUE(replica.Apply(resp));
  EXPECT_EQ(ChecksumOf(replica.x), resp.replica_checksum());
  EXPECT_EQ(resp.replica_checksum(), Status().replica_checksum());
}

TEST_F(ServiceTest, PullWhoseDeadlineExpiresGetsDeadlineExceededAndServerGoesOn) {
  ASSERT_NO_FATAL_FAILURE(Start(OneBitAdamConfig(2, 100)));
  const std::vector<float> x0 = InitialWeights(kN);
  ASSERT_TRUE(Register(RegisterRequestFor(0, 2, x0)).ok());
  ASSERT_TRUE(Register(RegisterRequestFor(1, 2, x0)).ok());
  for (uint64_t t = 0; t < 3; ++t) {
    ASSERT_TRUE(Push(PushRequestFor(0, t, OneBit(Gradient(kN, 0, t)))).ok());
    const std::string before = Status().SerializeAsString();
    v1::PullResponse resp;
    grpc::Status s = Pull(PullRequestFor(0, t + 1, -1, 0), &resp,
                          absl::Milliseconds(100));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << s.error_message();
    EXPECT_EQ(Status().SerializeAsString(), before);
    ASSERT_TRUE(Push(PushRequestFor(1, t, OneBit(Gradient(kN, 1, t)))).ok());
    s = Pull(PullRequestFor(0, t + 1, -1, 0), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.step(), t + 1);
    EXPECT_EQ(resp.kind(), v1::PULL_KIND_SNAPSHOT);
  }
}

TEST_F(ServiceTest, HealthIsNotServingUntilTheModelIsRegistered) {
  ASSERT_NO_FATAL_FAILURE(Start(OneBitAdamConfig(2, 100)));
  constexpr int kServing = 1, kNotServing = 2;
  EXPECT_EQ(HealthCheck(""), kServing);
  EXPECT_EQ(HealthCheck(kServiceName), kNotServing);
  EXPECT_EQ(HealthCheck("no.such.Service"),
            -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  // A refused registration does not flip it.
  v1::RegisterRequest bad = RegisterRequestFor(0, 3, InitialWeights(kN));
  EXPECT_FALSE(Register(bad).ok());
  EXPECT_EQ(HealthCheck(kServiceName), kNotServing);
  ASSERT_TRUE(Register(RegisterRequestFor(0, 2, InitialWeights(kN))).ok());
  EXPECT_EQ(HealthCheck(kServiceName), kServing);
  EXPECT_EQ(HealthCheck(""), kServing);
}

// ---------------------------------------------------------------------------
// Bad input. Three expected workers; 0 and 1 registered, 2 not; worker 0 has
// pushed step 0, so a round is half full when each bad request arrives.

class ServiceBadInput : public ServiceTest {
 protected:
  static constexpr int kMaxMessage = 1 << 20;

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Start(OneBitAdamConfig(3, 100), kMaxMessage));
    ASSERT_TRUE(Register(RegisterRequestFor(0, 3, x0_)).ok());
    ASSERT_TRUE(Register(RegisterRequestFor(1, 3, x0_)).ok());
    ASSERT_TRUE(Push(PushRequestFor(0, 0, OneBit(Gradient(kN, 0, 0)))).ok());
    before_ = Status();
    ASSERT_EQ(before_.pushes_pending(), 1u);
  }

  // The code, every substring in the message, and the whole status (state
  // checksum included) byte-for-byte as before.
  void ExpectRejected(const grpc::Status& s, grpc::StatusCode code,
                      std::vector<std::string> substrings) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    for (const std::string& sub : substrings) {
      EXPECT_THAT(s.error_message(), HasSubstr(sub));
    }
    v1::GetStatusResponse after = Status();
    EXPECT_EQ(after.state_checksum(), before_.state_checksum());
    EXPECT_EQ(after.SerializeAsString(), before_.SerializeAsString());
  }

  // Completes round 0 with valid pushes from workers 1 and 2.
  void CompleteRound() {
    ASSERT_TRUE(Register(RegisterRequestFor(2, 3, x0_)).ok());
    ASSERT_TRUE(Push(PushRequestFor(1, 0, OneBit(Gradient(kN, 1, 0)))).ok());
    ASSERT_TRUE(Push(PushRequestFor(2, 0, OneBit(Gradient(kN, 2, 0)))).ok());
    ASSERT_EQ(Status().current_step(), 1u);
  }

  const std::vector<float> x0_ = InitialWeights(kN);
  v1::GetStatusResponse before_;
};

TEST_F(ServiceBadInput, GarbagePayloadIsInvalidArgument) {
  v1::EncodedTensor t = OneBit(Gradient(kN, 1, 0));
  t.set_payload("this is not a onebit payload");
  ExpectRejected(Push(PushRequestFor(1, 0, t)), grpc::StatusCode::INVALID_ARGUMENT,
                 {"gradient", "payload"});
}

TEST_F(ServiceBadInput, TruncatedOneBitPayloadIsInvalidArgument) {
  v1::EncodedTensor t = OneBit(Gradient(kN, 1, 0));
  t.mutable_payload()->resize(t.payload().size() - 1);
  ExpectRejected(Push(PushRequestFor(1, 0, t)), grpc::StatusCode::INVALID_ARGUMENT,
                 {"gradient", "payload"});
}

TEST_F(ServiceBadInput, NonFiniteOneBitScaleIsInvalidArgument) {
  v1::EncodedTensor t = OneBit(Gradient(kN, 1, 0));
  const float inf = INFINITY;
  std::memcpy(t.mutable_payload()->data(), &inf, sizeof(inf));  // block 0 scale
  ExpectRejected(Push(PushRequestFor(1, 0, t)), grpc::StatusCode::INVALID_ARGUMENT,
                 {"gradient", "scale"});
}

TEST_F(ServiceBadInput, UnknownCodecIsInvalidArgument) {
  v1::EncodedTensor t = Fp32Tensor(Gradient(kN, 1, 0));
  t.set_codec(static_cast<v1::Codec>(99));
  ExpectRejected(Push(PushRequestFor(1, 0, t)), grpc::StatusCode::INVALID_ARGUMENT,
                 {"gradient", "codec is 99"});
  t.set_codec(v1::CODEC_UNSPECIFIED);
  ExpectRejected(Push(PushRequestFor(1, 0, t)), grpc::StatusCode::INVALID_ARGUMENT,
                 {"gradient", "codec"});
}

TEST_F(ServiceBadInput, ElementCountNotMatchingTheShardIsInvalidArgument) {
  ExpectRejected(
      Push(PushRequestFor(1, 0, Fp32Tensor(Gradient(kN - 256, 1, 0)))),
      grpc::StatusCode::INVALID_ARGUMENT,
      {"gradient", "num_elements is 768; expected 1024"});
  ExpectRejected(Push(PushRequestFor(1, 0, OneBit(Gradient(kN + 256, 1, 0)))),
                 grpc::StatusCode::INVALID_ARGUMENT,
                 {"gradient", "num_elements is 1280; expected 1024"});
  // The count field lying about the payload.
  v1::EncodedTensor t = Fp32Tensor(Gradient(kN, 1, 0));
  t.set_num_elements(kN / 2);
  ExpectRejected(Push(PushRequestFor(1, 0, t)), grpc::StatusCode::INVALID_ARGUMENT,
                 {"gradient", "num_elements"});
}

TEST_F(ServiceBadInput, WorkerIdBeyondTheExpectedCountIsInvalidArgument) {
  ExpectRejected(Push(PushRequestFor(3, 0, OneBit(Gradient(kN, 3, 0)))),
                 grpc::StatusCode::INVALID_ARGUMENT,
                 {"worker_id is 3", "expected 0..2"});
  ExpectRejected(Register(RegisterRequestFor(7, 3, x0_)),
                 grpc::StatusCode::INVALID_ARGUMENT, {"worker_id is 7"});
  v1::PullResponse resp;
  ExpectRejected(Pull(PullRequestFor(9, 0, -1, 0), &resp),
                 grpc::StatusCode::INVALID_ARGUMENT, {"worker_id is 9"});
}

TEST_F(ServiceBadInput, PushFromAWorkerThatNeverRegisteredIsFailedPrecondition) {
  ExpectRejected(Push(PushRequestFor(2, 0, OneBit(Gradient(kN, 2, 0)))),
                 grpc::StatusCode::FAILED_PRECONDITION,
                 {"worker_id 2", "Register"});
}

TEST_F(ServiceBadInput, LayoutMismatchOnRegisterNamesTheFirstDifference) {
  v1::RegisterRequest req = RegisterRequestFor(2, 3, x0_);
  req.mutable_layout()->mutable_tensors(0)->set_shape(1, 128);
  req.mutable_layout()->mutable_tensors(1)->set_name("bias");
  ExpectRejected(Register(req), grpc::StatusCode::FAILED_PRECONDITION,
                 {"layout", "tensors[0] ('w').shape[1] is 128, expected 256"});
  req = RegisterRequestFor(2, 3, x0_);
  req.mutable_layout()->mutable_tensors(1)->set_name("bias");
  ExpectRejected(Register(req), grpc::StatusCode::FAILED_PRECONDITION,
                 {"tensors[1].name is 'bias', expected 'b'"});
  req = RegisterRequestFor(2, 3, x0_);
  req.mutable_layout()->add_tensors()->set_name("extra");
  req.mutable_layout()->mutable_tensors(2)->add_shape(4);
  ExpectRejected(Register(req), grpc::StatusCode::FAILED_PRECONDITION,
                 {"layout has 3 tensors, expected 2"});
  req = RegisterRequestFor(2, 2, x0_);
  ExpectRejected(Register(req), grpc::StatusCode::FAILED_PRECONDITION,
                 {"num_workers is 2"});
  req = RegisterRequestFor(2, 3, x0_);
  req.set_num_shards(2);
  ExpectRejected(Register(req), grpc::StatusCode::FAILED_PRECONDITION,
                 {"num_shards"});
  // Invalid layouts are malformed, not mismatched.
  req = RegisterRequestFor(2, 3, x0_);
  req.mutable_layout()->mutable_tensors(1)->set_name("");
  ExpectRejected(Register(req), grpc::StatusCode::INVALID_ARGUMENT,
                 {"layout.tensors[1]"});
}

TEST_F(ServiceBadInput, NonFiniteFp32PushIsRejectedAndTheRoundIsNotPoisoned) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> g = Gradient(kN, 1, 0);
    g[517] = bad;
    ExpectRejected(Push(PushRequestFor(1, 0, Fp32Tensor(g))),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"gradient", "element 517", "not finite"});
  }
  // The same worker then sends a valid push and the round completes.
  ASSERT_NO_FATAL_FAILURE(CompleteRound());
  v1::PullResponse resp;
  grpc::Status s = Pull(PullRequestFor(1, 1, -1, 0), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<float> x = DecodeAll(resp.weights());
  ASSERT_EQ(x.size(), kN);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_TRUE(std::isfinite(x[i])) << i;
  EXPECT_NE(ChecksumOf(x), ChecksumOf(x0_));
}

TEST_F(ServiceBadInput, OversizedMessageIsResourceExhausted) {
  // 512Ki fp32 elements: 2 MiB, twice the server's limit.
  std::vector<float> big(512 * 1024, 0.5f);
  ExpectRejected(Push(PushRequestFor(1, 0, Fp32Tensor(big))),
                 grpc::StatusCode::RESOURCE_EXHAUSTED, {});
  v1::RegisterRequest req = RegisterRequestFor(2, 3, x0_);
  *req.mutable_initial_weights() = Fp32Tensor(big);
  ExpectRejected(Register(req), grpc::StatusCode::RESOURCE_EXHAUSTED, {});
  // The server goes on.
  ASSERT_NO_FATAL_FAILURE(CompleteRound());
}

TEST_F(ServiceBadInput, StalePushIsAcknowledgedAsDuplicateAndNotApplied) {
  // Still pending: the same (worker, step) again.
  v1::PushResponse resp;
  grpc::Status s = Push(PushRequestFor(0, 0, OneBit(Gradient(kN, 0, 5))), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.duplicate());
  EXPECT_EQ(Status().SerializeAsString(), before_.SerializeAsString());

  ASSERT_NO_FATAL_FAILURE(CompleteRound());
  before_ = Status();
  // Every worker pushed step 0 (a round needs all of them), so a push for
  // step 0 now is a duplicate under shard.cc's rules, never applied again.
  for (uint32_t w = 0; w < 3; ++w) {
    s = Push(PushRequestFor(w, 0, OneBit(Gradient(kN, w, 0))), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(resp.duplicate());
    EXPECT_EQ(resp.current_step(), 1u);
  }
  EXPECT_EQ(Status().SerializeAsString(), before_.SerializeAsString());
  // A step too far ahead names the current one.
  ExpectRejected(Push(PushRequestFor(1, 3, OneBit(Gradient(kN, 1, 3)))),
                 grpc::StatusCode::FAILED_PRECONDITION,
                 {"step is 3", "at step 1"});
  v1::PullResponse pull;
  ExpectRejected(Pull(PullRequestFor(1, 3, -1, 0), &pull),
                 grpc::StatusCode::FAILED_PRECONDITION,
                 {"step is 3", "at step 1"});
}

TEST_F(ServiceBadInput, WrongGradientSpaceIsFailedPrecondition) {
  ExpectRejected(Push(PushRequestFor(1, 0, OneBit(Gradient(kN, 1, 0)),
                                     v1::GRADIENT_SPACE_PRECONDITIONED)),
                 grpc::StatusCode::FAILED_PRECONDITION,
                 {"space is PRECONDITIONED", "expected RAW"});
}

// A push that says it carries the worker's momentum where the shard expects
// a gradient (--onebit_momentum=server, or any warmup step) is refused and
// changes nothing.
TEST_F(ServiceBadInput, MomentumPushToAGradientShardIsFailedPrecondition) {
  const std::string before = Status().SerializeAsString();
  v1::PushRequest req = PushRequestFor(1, 0, OneBit(Gradient(kN, 1, 0)));
  req.set_momentum(true);
  ExpectRejected(Push(req), grpc::StatusCode::FAILED_PRECONDITION,
                 {"momentum is true", "expected false", "--onebit_momentum=server"});
  EXPECT_EQ(Status().SerializeAsString(), before);
}

TEST_F(ServiceBadInput, FrozenVarianceBeforeTheFreezeIsFailedPrecondition) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  v1::GetFrozenVarianceRequest req;
  req.set_worker_id(1);
  v1::GetFrozenVarianceResponse resp;
  ExpectRejected(stub_->GetFrozenVariance(&ctx, req, &resp),
                 grpc::StatusCode::FAILED_PRECONDITION, {"frozen from step 100", "at step 0"});
}

// Issue 9: every refusal carries its reason in the "pserver-reason" trailer,
// which the client-side conversion turns back into the status's reason.
TEST_F(ServiceBadInput, RejectionsCarryTheirReasonInATrailer) {
  struct Case {
    v1::PushRequest req;
    v1::RejectReason reason;
  };
  v1::EncodedTensor garbage = OneBit(Gradient(kN, 1, 0));
  garbage.set_payload("not a payload");
  const Case cases[] = {
      {PushRequestFor(1, 5, OneBit(Gradient(kN, 1, 5))),
       v1::REJECT_REASON_FUTURE_STEP},
      {PushRequestFor(1, 0, OneBit(Gradient(kN, 1, 0)),
                      v1::GRADIENT_SPACE_PRECONDITIONED),
       v1::REJECT_REASON_WRONG_SPACE},
      {PushRequestFor(1, 0, garbage), v1::REJECT_REASON_INVALID_PAYLOAD},
      {PushRequestFor(2, 0, OneBit(Gradient(kN, 2, 0))),
       v1::REJECT_REASON_NOT_REGISTERED},
      {PushRequestFor(7, 0, OneBit(Gradient(kN, 2, 0))),
       v1::REJECT_REASON_UNKNOWN_WORKER},
  };
  for (const Case& c : cases) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    v1::PushResponse resp;
    grpc::Status g = stub_->Push(&ctx, c.req, &resp);
    ASSERT_FALSE(g.ok());
    auto it = ctx.GetServerTrailingMetadata().find(kReasonTrailer);
    ASSERT_NE(it, ctx.GetServerTrailingMetadata().end());
    EXPECT_EQ(std::string(it->second.data(), it->second.size()),
              ReasonName(c.reason));
    absl::Status s = FromGrpcStatus(g, ctx);
    EXPECT_EQ(ReasonOf(s), c.reason) << s;
    EXPECT_EQ(s.message(), g.error_message());
  }
  // A successful call carries no reason.
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(10));
  v1::PushResponse resp;
  ASSERT_TRUE(stub_->Push(&ctx, PushRequestFor(1, 0, OneBit(Gradient(kN, 1, 0))),
                          &resp).ok());
  EXPECT_EQ(ctx.GetServerTrailingMetadata().count(kReasonTrailer), 0u);
}

TEST_F(ServiceTest, PushAndPullBeforeRegistrationAreFailedPrecondition) {
  ASSERT_NO_FATAL_FAILURE(Start(OneBitAdamConfig(2, 100)));
  const std::string before = Status().SerializeAsString();
  EXPECT_FALSE(Status().model_registered());
  grpc::Status s = Push(PushRequestFor(0, 0, OneBit(Gradient(kN, 0, 0))));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("Register"));
  v1::PullResponse resp;
  s = Pull(PullRequestFor(0, 0, -1, 0), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("Register"));
  // The first worker must bring the initial weights.
  v1::RegisterRequest req = RegisterRequestFor(0, 2, InitialWeights(kN));
  req.clear_initial_weights();
  s = Register(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("initial_weights"));
  EXPECT_EQ(Status().SerializeAsString(), before);
}

}  // namespace
}  // namespace pserver
