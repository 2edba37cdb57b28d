// Worker residual persistence: Client::SaveState / LoadState (and the same
// record as bytes, SerializeState / RestoreState) round trip
// through real in-process shards, the file format, and refusals that leave
// state unchanged.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "worker/client.h"

namespace pserver {
namespace {

constexpr uint64_t kParams = 1000;

v1::ModelLayout Layout() {
  v1::ModelLayout l;
  v1::TensorSpec* t = l.add_tensors();
  t->set_name("w");
  t->add_shape(kParams);
  return l;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Two Adam shards for one worker on loopback, and clients that all act as
// worker 0 (a restarted worker registers again).
class ClientState : public ::testing::Test {
 protected:
  void SetUp() override {
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
      servers_.push_back(std::move(server).value());
    }
    options_.server_addresses = addresses;
    options_.push_codec = v1::CODEC_ONEBIT;
  }
  void TearDown() override {
    for (auto& s : servers_) s->Shutdown(absl::Seconds(1));
  }

  // A registered client that has run `steps` steps (nonzero residuals).
  std::unique_ptr<Client> Worker(int steps, float phase = 0.0f) {
    auto c = Client::Connect(options_);
    EXPECT_TRUE(c.ok()) << c.status();
    std::vector<float> x(kParams, 0.5f), g(kParams);
    EXPECT_TRUE((*c)->Register(Layout(), x).ok());
    for (int t = 0; t < steps; ++t) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.1f * i + t + phase);
      EXPECT_TRUE((*c)->Step(g).ok());
    }
    return std::move(c).value();
  }

  std::string Path(const std::string& name) const {
    return ::testing::TempDir() + "/client_state_" + name;
  }

  std::vector<std::unique_ptr<ShardServer>> servers_;
  ClientOptions options_;
};

TEST_F(ClientState, SaveLoadRoundTripAndRefusals) {
  auto a = Worker(3);
  ASSERT_GT(a->ResidualNorm(), 0.0);
  const std::string path = Path("worker0.state");
  ASSERT_TRUE(a->SaveState(path).ok());

  // A restarted worker: register, load, and it holds the same residuals.
  auto b = Worker(0);
  EXPECT_EQ(b->ResidualNorm(), 0.0);
  ASSERT_TRUE(b->LoadState(path).ok());
  // A loaded residual's norm is a pass in double; the encode's, the
  // kernel's float lanes (error_feedback.h): equal to ~1e-7.
  EXPECT_NEAR(b->ResidualNorm(), a->ResidualNorm(), 1e-6 * a->ResidualNorm());
  const std::string again = path + ".again";
  ASSERT_TRUE(b->SaveState(again).ok());
  EXPECT_EQ(ReadAll(again), ReadAll(path));

  // Refusals change nothing.
  auto c = Worker(0);
  std::string bytes = ReadAll(path);
  std::string corrupt = bytes;
  corrupt[corrupt.size() / 2] ^= 1;
  WriteAll(path + ".corrupt", corrupt);
  EXPECT_EQ(c->LoadState(path + ".corrupt").code(), absl::StatusCode::kDataLoss);
  WriteAll(path + ".short", bytes.substr(0, bytes.size() / 3));
  EXPECT_EQ(c->LoadState(path + ".short").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c->LoadState(path + ".missing").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->ResidualNorm(), 0.0);
}

// SerializeState / RestoreState (what the Python state_dict() carries) are
// the file's record as bytes: the same bytes, the same checks.
TEST_F(ClientState, SerializedRecordIsTheFile) {
  auto a = Worker(3);
  ASSERT_TRUE(a->SaveState(Path("bytes.state")).ok());
  absl::StatusOr<std::string> record = a->SerializeState();
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(*record, ReadAll(Path("bytes.state")));

  auto b = Worker(0);
  std::string corrupt = *record;
  corrupt[corrupt.size() / 2] ^= 1;
  absl::Status st = b->RestoreState(corrupt, "state_dict");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("state_dict"), std::string::npos) << st;
  EXPECT_EQ(b->ResidualNorm(), 0.0);
  ASSERT_TRUE(b->RestoreState(*record, "state_dict").ok());
  // A loaded residual's norm is a pass in double; the encode's, the
  // kernel's float lanes (error_feedback.h): equal to ~1e-7.
  EXPECT_NEAR(b->ResidualNorm(), a->ResidualNorm(), 1e-6 * a->ResidualNorm());

  auto unregistered = Client::Connect(options_);
  ASSERT_TRUE(unregistered.ok());
  EXPECT_EQ((*unregistered)->SerializeState().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The documented layout, written here byte by byte: LoadState reads it and
// SaveState writes it back identically. Version 1 files (before the worker
// momentum) keep loading and are written back as version 2 with no momentum.
std::string HandmadeState(Client& c, bool v2, bool with_momentum) {
  std::string file(v2 ? "PSWKST02" : "PSWKST01", 8);
  auto put = [&file](const void* p, size_t n) {
    file.append(static_cast<const char*>(p), n);
  };
  const uint32_t header[3] = {0, 1, 2};  // worker, workers, shards
  const uint64_t step = c.step(), params = kParams;
  put(header, sizeof(header));
  put(&step, 8);
  put(&params, 8);
  for (uint32_t s = 0; s < 2; ++s) {
    ShardRange r = ShardRangeFor(kParams, 2, s);
    const uint32_t stage = v1::OPTIMIZER_STAGE_WARMUP;
    put(&r.begin, 8);
    put(&r.end, 8);
    put(&stage, 4);
    // warmup residual, push residual, then (v2) the momentum: shard 1's
    // when with_momentum, else none (n = 0).
    std::vector<float> scales = {0.25f, -0.5f};
    if (v2) scales.push_back(0.125f);
    for (size_t k = 0; k < scales.size(); ++k) {
      const uint64_t n = k < 2 || (with_momentum && s == 1) ? r.size() : 0;
      put(&n, 8);
      for (uint64_t i = 0; i < n; ++i) {
        const float v = scales[k] * static_cast<float>(i + s);
        put(&v, 4);
      }
    }
  }
  Checksum64 h;
  h.Update(file.data(), file.size());
  const uint64_t sum = h.Finish();
  put(&sum, 8);
  return file;
}

TEST_F(ClientState, FileFormatIsAsDocumented) {
  auto c = Worker(0);
  for (bool with_momentum : {false, true}) {
    const std::string file = HandmadeState(*c, /*v2=*/true, with_momentum);
    WriteAll(Path("handmade.state"), file);
    ASSERT_TRUE(c->LoadState(Path("handmade.state")).ok()) << with_momentum;
    ASSERT_TRUE(c->SaveState(Path("handmade.again")).ok());
    EXPECT_TRUE(ReadAll(Path("handmade.again")) == file) << with_momentum;
  }
  WriteAll(Path("handmade.v1"), HandmadeState(*c, /*v2=*/false, false));
  ASSERT_TRUE(c->LoadState(Path("handmade.v1")).ok());
  ASSERT_TRUE(c->SaveState(Path("handmade.again")).ok());
  EXPECT_TRUE(ReadAll(Path("handmade.again")) ==
              HandmadeState(*c, /*v2=*/true, false));
}

// Hole 7: LoadState set each shard's residuals in turn and could fail at a
// later shard (a non-finite value passes the checksum), leaving the earlier
// shards loaded. Now nothing changes unless everything is valid.
TEST_F(ClientState, Hole7LoadStateAllOrNothing) {
  auto a = Worker(3);
  const std::string good = Path("hole7.state");
  ASSERT_TRUE(a->SaveState(good).ok());
  // The last float of the file is the last shard's last push residual (its
  // momentum, n = 0, and the checksum follow).
  std::string bytes = ReadAll(good);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&bytes[bytes.size() - 8 - 8 - 4], &nan, 4);
  Checksum64 h;
  h.Update(bytes.data(), bytes.size() - 8);
  const uint64_t sum = h.Finish();
  std::memcpy(&bytes[bytes.size() - 8], &sum, 8);
  WriteAll(Path("hole7.nan"), bytes);

  // A worker with residuals of its own, different from the file's.
  auto b = Worker(1, /*phase=*/1.0f);
  ASSERT_GT(b->ResidualNorm(), 0.0);
  ASSERT_TRUE(b->SaveState(Path("hole7.before")).ok());
  absl::Status st = b->LoadState(Path("hole7.nan"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  const uint64_t last = ShardRangeFor(kParams, 2, 1).size() - 1;
  EXPECT_NE(st.message().find(absl::StrCat("shard 1 push residual element ",
                                           last, " is not finite")),
            std::string::npos)
      << st;
  ASSERT_TRUE(b->SaveState(Path("hole7.after")).ok());
  EXPECT_EQ(ReadAll(Path("hole7.after")), ReadAll(Path("hole7.before")));
  // The valid file still loads.
  EXPECT_TRUE(b->LoadState(good).ok());
  // A loaded residual's norm is a pass in double; the encode's, the
  // kernel's float lanes (error_feedback.h): equal to ~1e-7.
  EXPECT_NEAR(b->ResidualNorm(), a->ResidualNorm(), 1e-6 * a->ResidualNorm());
}

}  // namespace
}  // namespace pserver
