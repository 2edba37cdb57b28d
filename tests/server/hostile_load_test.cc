// Hostile input under load: 10,000+ malformed requests of 12 kinds, from
// several threads, to a live shard with real channels. Every one is
// rejected with its documented code, the shard stays healthy and keeps
// training, its state hash does not move, the rejection counters add up to
// what was sent, and memory does not grow with the number of requests.
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/proc_status.h"

namespace pserver {
namespace {

using testing_util::RssKb;

using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;

constexpr int kRequests = 10800;  // 12 kinds x 900
constexpr int kThreads = 4;

struct Kind {
  const char* name;
  grpc::StatusCode code;
  const char* reason;  // rejected_requests_total label, or "" if not counted
};

const Kind kKinds[] = {
    {"garbage onebit payload", grpc::StatusCode::INVALID_ARGUMENT, "invalid_payload"},
    {"unknown codec", grpc::StatusCode::INVALID_ARGUMENT, "invalid_payload"},
    {"wrong element count", grpc::StatusCode::INVALID_ARGUMENT, "wrong_size"},
    {"worker id out of range", grpc::StatusCode::INVALID_ARGUMENT, "unknown_worker"},
    {"future step", grpc::StatusCode::FAILED_PRECONDITION, "future_step"},
    {"NaN in fp32 push", grpc::StatusCode::INVALID_ARGUMENT, "invalid_payload"},
    {"wrong gradient space", grpc::StatusCode::FAILED_PRECONDITION, "wrong_space"},
    {"layout mismatch", grpc::StatusCode::FAILED_PRECONDITION, "layout_mismatch"},
    {"worker count mismatch", grpc::StatusCode::FAILED_PRECONDITION, "config_mismatch"},
    {"malformed layout", grpc::StatusCode::INVALID_ARGUMENT, "bad_layout"},
    {"pull far ahead", grpc::StatusCode::FAILED_PRECONDITION, "future_step"},
    {"oversized message", grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
};
constexpr int kKindCount = sizeof(kKinds) / sizeof(kKinds[0]);

// Sends request number i (of kind i % kKindCount); returns its status code.
grpc::StatusCode Send(v1::ParameterServer::Stub& stub, int i) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  const int kind = i % kKindCount;
  const uint64_t n = kSmallElements;
  v1::PushResponse push_resp;
  v1::RegisterResponse reg_resp;
  v1::PullResponse pull_resp;
  switch (kind) {
    case 0: {
      v1::EncodedTensor t;
      t.set_codec(v1::CODEC_ONEBIT);
      t.set_num_elements(n);
      t.set_payload(std::string(17 + i % 50, static_cast<char>(i)));
      return stub.Push(&ctx, PushRequestFor(0, 1, t), &push_resp).error_code();
    }
    case 1: {
      v1::EncodedTensor t = Fp32Tensor(Gradient(n, 0, 1));
      t.set_codec(static_cast<v1::Codec>(40 + i % 100));
      return stub.Push(&ctx, PushRequestFor(0, 1, t), &push_resp).error_code();
    }
    case 2:
      return stub
          .Push(&ctx, PushRequestFor(1, 1, Fp32Tensor(Gradient(n + 256, 1, 1))),
                &push_resp)
          .error_code();
    case 3:
      return stub
          .Push(&ctx, PushRequestFor(2 + i % 1000, 1, Fp32Tensor(Gradient(n, 0, 1))),
                &push_resp)
          .error_code();
    case 4:
      return stub
          .Push(&ctx, PushRequestFor(1, 2 + i, Fp32Tensor(Gradient(n, 1, 1))),
                &push_resp)
          .error_code();
    case 5: {
      std::vector<float> g = Gradient(n, 1, 1);
      g[i % n] = (i % 3 == 0) ? NAN : (i % 3 == 1 ? INFINITY : -INFINITY);
      return stub.Push(&ctx, PushRequestFor(1, 1, Fp32Tensor(g)), &push_resp)
          .error_code();
    }
    case 6:
      return stub
          .Push(&ctx,
                PushRequestFor(1, 1, Fp32Tensor(Gradient(n, 1, 1)),
                               v1::GRADIENT_SPACE_PRECONDITIONED),
                &push_resp)
          .error_code();
    case 7: {
      v1::RegisterRequest r = RegisterRequestFor(1, 2, InitialWeights(n));
      r.mutable_layout()->mutable_tensors(0)->set_shape(0, 4 + i % 7);  // never the real 3
      return stub.Register(&ctx, r, &reg_resp).error_code();
    }
    case 8: {
      v1::RegisterRequest r = RegisterRequestFor(1, 2, InitialWeights(n));
      r.set_num_workers(3 + i % 5);
      return stub.Register(&ctx, r, &reg_resp).error_code();
    }
    case 9: {
      v1::RegisterRequest r = RegisterRequestFor(1, 2, InitialWeights(n));
      r.mutable_layout()->mutable_tensors(1)->set_name("");
      return stub.Register(&ctx, r, &reg_resp).error_code();
    }
    case 10:
      return stub.Pull(&ctx, PullRequestFor(1, 3 + i, 0, 0), &pull_resp)
          .error_code();
    default: {
      // Over the server's 1 MiB limit: refused by gRPC before any handler.
      v1::EncodedTensor t;
      t.set_codec(v1::CODEC_FP32);
      t.set_num_elements(n);
      t.set_payload(std::string((1 << 20) + 4096, 'x'));
      return stub.Push(&ctx, PushRequestFor(1, 1, t), &push_resp).error_code();
    }
  }
}

std::map<std::string, double> RejectedCounts(prometheus::Registry& registry) {
  prometheus::TextSerializer serializer;
  std::ostringstream text;
  serializer.Serialize(text, registry.Collect());
  std::map<std::string, double> out;
  std::istringstream lines(text.str());
  std::string line;
  const std::string prefix = "pserver_server_rejected_requests_total{";
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    size_t r = line.find("reason=\"");
    size_t e = line.find('"', r + 8);
    size_t sp = line.rfind(' ');
    out[line.substr(r + 8, e - r - 8)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

TEST(HostileLoad, TenThousandMalformedRequestsAreRejectedAndChangeNothing) {
  prometheus::Registry registry;
  ShardConfig config;
  config.num_workers = 2;
  config.optimizer.freeze_step = 1000;
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.max_message_bytes = 1 << 20;
  auto server = ShardServer::Start(config, options, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  Shard& shard = *(*server)->shard();
  const std::vector<float> x0 = InitialWeights(kSmallElements);
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(shard.Register(RegisterRequestFor(w, 2, x0)).ok());
  }
  // One real round, then worker 0 has pushed step 1 (so the round is open).
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(shard.Push(PushRequestFor(w, 0, Fp32Tensor(Gradient(kSmallElements, w, 0)))).ok());
  }
  ASSERT_TRUE(shard.Push(PushRequestFor(0, 1, Fp32Tensor(Gradient(kSmallElements, 0, 1)))).ok());
  const uint64_t state = shard.Status().state_checksum();
  const std::map<std::string, double> before = RejectedCounts(registry);

  std::atomic<int> next{0};
  std::atomic<int> wrong{0};
  std::vector<std::atomic<int>> per_kind(kKindCount);
  std::atomic<long> rss_early{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      grpc::ChannelArguments args;
      args.SetMaxSendMessageSize(4 << 20);
      auto stub = v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
          absl::StrCat("127.0.0.1:", (*server)->port()),
          grpc::InsecureChannelCredentials(), args));
      for (int i = next++; i < kRequests; i = next++) {
        grpc::StatusCode got = Send(*stub, i);
        if (got != kKinds[i % kKindCount].code) {
          if (wrong++ < 10) {
            ADD_FAILURE() << kKinds[i % kKindCount].name << " (request " << i
                          << ") got code " << got << ", expected "
                          << kKinds[i % kKindCount].code;
          }
        } else {
          ++per_kind[i % kKindCount];
        }
        if (i == 2000) rss_early = RssKb();  // whichever thread sends it
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  for (int k = 0; k < kKindCount; ++k) {
    EXPECT_EQ(per_kind[k].load(), kRequests / kKindCount) << kKinds[k].name;
  }
  // Nothing moved.
  EXPECT_EQ(shard.Status().state_checksum(), state);
  // Rejections by reason add up to what was sent.
  std::map<std::string, double> sent;
  for (int k = 0; k < kKindCount; ++k) {
    if (*kKinds[k].reason) sent[kKinds[k].reason] += kRequests / kKindCount;
  }
  const std::map<std::string, double> after = RejectedCounts(registry);
  for (const auto& [reason, count] : sent) {
    double was = before.count(reason) ? before.at(reason) : 0;
    EXPECT_EQ(after.at(reason) - was, count) << reason;
  }
  // Memory: the last 8,800 requests did not grow the process by more than a
  // few MB (the shard keeps nothing from a rejected request).
  long rss_late = RssKb();
  ASSERT_GT(rss_early.load(), 0);
  EXPECT_LT(rss_late - rss_early.load(), 32 * 1024)
      << "RSS grew from " << rss_early.load() << " kB to " << rss_late << " kB";
  // Still healthy and still training: the open round completes.
  ASSERT_TRUE(shard.Push(PushRequestFor(1, 1, Fp32Tensor(Gradient(kSmallElements, 1, 1)))).ok());
  EXPECT_EQ(shard.Status().current_step(), 2u);
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace pserver
