// Worker residual persistence: Client::SaveState / LoadState round trip
// through real in-process shards, and refusals that leave state unchanged.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "worker/client.h"

namespace pserver {
namespace {

v1::ModelLayout Layout() {
  v1::ModelLayout l;
  v1::TensorSpec* t = l.add_tensors();
  t->set_name("w");
  t->add_shape(1000);
  return l;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ClientState, SaveLoadRoundTripAndRefusals) {
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> addresses;
  for (uint32_t s = 0; s < 2; ++s) {
    ShardConfig c;
    c.shard_index = s;
    c.num_shards = 2;
    c.num_workers = 1;
    c.optimizer.kind = OptimizerKind::kAdam;
    ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    auto server = ShardServer::Start(c, o, nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    servers.push_back(std::move(server).value());
  }
  ClientOptions o;
  o.server_addresses = addresses;
  o.push_codec = v1::CODEC_ONEBIT;
  auto a = Client::Connect(o);
  ASSERT_TRUE(a.ok());
  std::vector<float> x(1000, 0.5f), g(1000);
  ASSERT_TRUE((*a)->Register(Layout(), x).ok());
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.1f * i + t);
    ASSERT_TRUE((*a)->Step(g).ok());
  }
  ASSERT_GT((*a)->ResidualNorm(), 0.0);
  const std::string path = ::testing::TempDir() + "/worker0.state";
  ASSERT_TRUE((*a)->SaveState(path).ok());

  // A restarted worker: register, load, and it holds the same residuals.
  auto b = Client::Connect(o);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->Register(Layout(), x).ok());
  EXPECT_EQ((*b)->ResidualNorm(), 0.0);
  ASSERT_TRUE((*b)->LoadState(path).ok());
  EXPECT_EQ((*b)->ResidualNorm(), (*a)->ResidualNorm());
  const std::string again = path + ".again";
  ASSERT_TRUE((*b)->SaveState(again).ok());
  EXPECT_EQ(ReadAll(again), ReadAll(path));

  // Refusals change nothing.
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(Layout(), x).ok());
  std::string bytes = ReadAll(path);
  std::string corrupt = bytes;
  corrupt[corrupt.size() / 2] ^= 1;
  std::ofstream(path + ".corrupt", std::ios::binary) << corrupt;
  EXPECT_EQ((*c)->LoadState(path + ".corrupt").code(),
            absl::StatusCode::kDataLoss);
  std::ofstream(path + ".short", std::ios::binary)
      << bytes.substr(0, bytes.size() / 3);
  EXPECT_EQ((*c)->LoadState(path + ".short").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*c)->LoadState(path + ".missing").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*c)->ResidualNorm(), 0.0);
  for (auto& s : servers) s->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace pserver
