// Shared by the client tests: in-process ShardServers on loopback, a test
// layout, deterministic values and gradients, and metric sums.
#ifndef PSERVER_TESTS_WORKER_CLIENT_TEST_UTIL_H_
#define PSERVER_TESTS_WORKER_CLIENT_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/shard_server.h"
#include "worker/client.h"
#include "tests/test_util/test_helpers.h"

namespace pserver {
namespace testing_util {

// 300 + 517 + 77 + 1 = 895 elements: not a multiple of kShardAlignment, and
// with 2 or 3 shards "b" straddles a shard boundary.
inline v1::ModelLayout TestLayout() {
  v1::ModelLayout l;
  auto add = [&l](const char* name, std::vector<uint64_t> shape) {
    v1::TensorSpec* t = l.add_tensors();
    t->set_name(name);
    for (uint64_t d : shape) t->add_shape(d);
  };
  add("a", {3, 100});
  add("b", {517});
  add("c", {7, 11});
  add("d", {});
  return l;
}

// Deterministic values that are multiples of 1/64 in [-1, 1]: their sums are
// exact in fp32, so only the optimizer's own arithmetic rounds.
inline std::vector<float> Values(uint64_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (uint64_t i = 0; i < n; ++i) {
    z ^= z << 13;
    z ^= z >> 7;
    z ^= z << 17;
    v[i] = static_cast<float>(static_cast<int>(z % 129) - 64) / 64.0f;
  }
  return v;
}

inline std::vector<float> Gradient(uint64_t n, uint32_t worker, uint64_t step) {
  return Values(n, 1000 + worker * 7919 + step * 104729);
}

inline uint64_t OneBitBytes(uint64_t n) {
  return 4 * ((n + 255) / 256) + (n + 7) / 8;
}


inline OptimizerConfig ExactSgd() {
  OptimizerConfig o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 1.0f;
  o.momentum = 0.0f;  // x_{t+1} = x_t - mean(g), rounded once
  return o;
}

// S shards on loopback, each with its own metrics registry.
struct Cluster {
  std::vector<std::unique_ptr<prometheus::Registry>> registries;
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> addresses;
  ShardConfig config;

  Shard* shard(size_t s) { return servers[s]->shard(); }
};

inline absl::StatusOr<std::unique_ptr<ShardServer>> StartShard(
    const ShardConfig& base, uint32_t index, int port,
    prometheus::Registry* registry) {
  ShardConfig c = base;
  c.shard_index = index;
  ServerOptions o;
  o.listen_address = absl::StrCat("127.0.0.1:", port);
  return ShardServer::Start(c, o, registry);
}

// config.num_shards shards of `config` (each with its own shard_index).
inline std::unique_ptr<Cluster> StartClusterWith(const ShardConfig& config) {
  auto c = std::make_unique<Cluster>();
  c->config = config;
  for (uint32_t s = 0; s < config.num_shards; ++s) {
    c->registries.push_back(std::make_unique<prometheus::Registry>());
    auto server = StartShard(c->config, s, 0, c->registries.back().get());
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    c->addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    c->servers.push_back(std::move(server).value());
  }
  return c;
}

inline std::unique_ptr<Cluster> StartCluster(
    uint32_t shards, uint32_t workers, const OptimizerConfig& opt,
    v1::Codec pull_codec, uint64_t chunk_elements = kDefaultChunkElements) {
  ShardConfig config;
  config.chunk_elements = chunk_elements;
  config.num_shards = shards;
  config.num_workers = workers;
  config.optimizer = opt;
  config.pull_codec = pull_codec;
  return StartClusterWith(config);
}

// Exact SGD on `shards` shards for `workers` workers whose leases expire
// after 300 ms: a worker silent that long is dropped from the rounds.
inline std::unique_ptr<Cluster> StartLeasedCluster(uint32_t shards,
                                                   uint32_t workers,
                                                   v1::Codec pull_codec) {
  ShardConfig config;
  config.num_shards = shards;
  config.num_workers = workers;
  config.optimizer = ExactSgd();
  config.pull_codec = pull_codec;
  config.lease_timeout = absl::Milliseconds(300);
  return StartClusterWith(config);
}

// Shard s stopped at once and started again on its port, fresh (no model,
// no registrations): a restart without a checkpoint.
inline ::testing::AssertionResult RestartShard(Cluster& cluster, uint32_t s) {
  const int port = cluster.servers[s]->port();
  cluster.servers[s]->Shutdown(absl::ZeroDuration());
  cluster.servers[s].reset();
  auto restarted = StartShard(cluster.config, s, port, nullptr);
  if (!restarted.ok()) {
    return ::testing::AssertionFailure() << restarted.status();
  }
  cluster.servers[s] = std::move(restarted).value();
  return ::testing::AssertionSuccess();
}

inline ClientOptions Options(const Cluster& c, uint32_t worker, v1::Codec push,
                      v1::Codec warmup = v1::CODEC_FP32) {
  ClientOptions o;
  o.server_addresses = c.addresses;
  o.worker_id = worker;
  o.num_workers = c.config.num_workers;
  o.push_codec = push;
  o.warmup_codec = warmup;
  o.rpc_timeout = absl::Seconds(10);
  o.pull_timeout = absl::Seconds(10);
  o.retry_budget = absl::Seconds(10);
  return o;
}

// Both workers take a step at once (a synchronous round needs both):
// workers 0 and 1, gradients Gradient(n, worker, t).
inline void StepBoth(Client& a, Client& b, uint64_t n, uint64_t t) {
  absl::Status sa, sb;
  std::thread other([&] { sb = b.Step(Gradient(n, 1, t)); });
  sa = a.Step(Gradient(n, 0, t));
  other.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
}

// Sum of a counter family's children whose labels include `match`.
inline double CounterSum(prometheus::Registry& r, const std::string& family,
                  const std::map<std::string, std::string>& match = {}) {
  double sum = 0;
  for (const prometheus::MetricFamily& f : r.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      size_t hits = 0;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        auto it = match.find(l.name);
        if (it != match.end() && it->second == l.value) ++hits;
      }
      if (hits == match.size()) sum += m.counter.value;
    }
  }
  return sum;
}

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_WORKER_CLIENT_TEST_UTIL_H_
