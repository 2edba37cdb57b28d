// A retry storm: every push is sent 1-3 times and some responses are
// dropped (a deadline so short the client gives up while the shard may
// still apply the call), pulls likewise; the shard's weights, optimizer
// state and replica end bit-identical to an undisturbed run.
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "common/error_feedback.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;
using testing_util::Replica;

constexpr uint32_t kWorkers = 4;
constexpr uint64_t kSteps = 25;

struct Storm {
  bool on = false;
  uint64_t seed = 0;
};

// One worker: gradients depend on its replica, so any divergence shows.
void Worker(uint32_t w, int port, Storm storm, std::vector<float>* final_x,
            int* dropped) {
  auto stub = v1::ParameterServer::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  std::mt19937_64 rng(storm.seed * 131 + w);
  auto call = [&](auto&& rpc) {
    // Storm: 0-2 extra sends first, some with a deadline that drops the
    // response; then one send whose answer is used.
    int extra = storm.on ? static_cast<int>(rng() % 3) : 0;
    for (int k = 0; k < extra; ++k) {
      grpc::ClientContext ctx;
      bool drop = rng() % 2 == 0;
      ctx.set_deadline(absl::ToChronoTime(
          absl::Now() + (drop ? absl::Microseconds(50) : absl::Seconds(20))));
      grpc::Status s = rpc(&ctx);
      if (!s.ok()) ++*dropped;
    }
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      grpc::Status s = rpc(&ctx);
      if (s.ok()) return;
      ADD_FAILURE() << "rpc failed: " << s.error_message();
      return;
    }
  };
  auto codec = MakeCodec(v1::CODEC_ONEBIT, v1::CodecParams());
  ASSERT_TRUE(codec.ok());
  std::vector<float> e(kSmallElements, 0.0f), next_e(kSmallElements);
  Replica replica;
  v1::PullResponse pulled;
  call([&](grpc::ClientContext* ctx) {
    return stub->Pull(ctx, PullRequestFor(w, 0, -1, 0, true), &pulled);
  });
  ASSERT_TRUE(replica.Apply(pulled));
  for (uint64_t t = 0; t < kSteps; ++t) {
    std::vector<float> g = Gradient(kSmallElements, w, t, 0.1f);
    for (size_t i = 0; i < g.size(); ++i) g[i] += 0.05f * replica.x[i];
    v1::PushRequest push = PushRequestFor(w, t, v1::EncodedTensor());
    ASSERT_TRUE(EncodeWithFeedback(**codec, g, e, 1.0f, t * 7 + w,
                                   push.mutable_gradient(),
                                   absl::MakeSpan(next_e))
                    .ok());
    std::swap(e, next_e);
    v1::PushResponse pr;
    call([&](grpc::ClientContext* ctx) { return stub->Push(ctx, push, &pr); });
    // Pulls are idempotent: a repeated one returns the same delta.
    v1::PullRequest q = PullRequestFor(w, t + 1, replica.step,
                                       ChecksumOf(replica.x));
    call([&](grpc::ClientContext* ctx) { return stub->Pull(ctx, q, &pulled); });
    ASSERT_TRUE(replica.Apply(pulled));
    ASSERT_EQ(ChecksumOf(replica.x), pulled.replica_checksum()) << "step " << t;
  }
  *final_x = replica.x;
}

struct Result {
  uint64_t state;
  std::vector<std::vector<float>> replicas;
  int dropped = 0;
};

Result RunJob(Storm storm) {
  ShardConfig config;
  config.num_workers = kWorkers;
  // Cross the 1-bit Adam freeze; the DeepSpeed-exact mode keeps raw-space
  // pushes valid after it, which is all these workers send.
  config.optimizer.freeze_step = 10;
  config.optimizer.preconditioned = false;
  config.optimizer.variance_floor = 0.0f;
  config.pull_codec = v1::CODEC_ONEBIT;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  auto server = ShardServer::Start(config, options, nullptr);
  EXPECT_TRUE(server.ok()) << server.status();
  Shard& shard = *(*server)->shard();
  for (uint32_t w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(shard.Register(RegisterRequestFor(w, kWorkers,
                                                  InitialWeights(kSmallElements)))
                    .ok());
  }
  Result r;
  r.replicas.resize(kWorkers);
  std::vector<int> dropped(kWorkers, 0);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back(Worker, w, (*server)->port(), storm, &r.replicas[w],
                         &dropped[w]);
  }
  for (std::thread& t : threads) t.join();
  for (int d : dropped) r.dropped += d;
  EXPECT_EQ(shard.Status().current_step(), kSteps);
  r.state = shard.Status().state_checksum();
  (*server)->Shutdown(absl::Seconds(1));
  return r;
}

TEST(RetryStorm, RepeatedAndDroppedCallsLeaveTheWeightsBitIdentical) {
  Result calm = RunJob(Storm{});
  Result storm = RunJob(Storm{true, 7});
  EXPECT_GT(storm.dropped, 0) << "the storm dropped no response";
  EXPECT_EQ(storm.state, calm.state);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(storm.replicas[w], calm.replicas[w]) << "worker " << w;
    EXPECT_EQ(storm.replicas[w], calm.replicas[0]);
  }
}

}  // namespace
}  // namespace pserver
