// Shared helpers of the server tests: a small model layout, deterministic
// weights and gradients, fp32 tensors and request builders.
#ifndef PSERVER_TESTS_SERVER_SERVER_TEST_UTIL_H_
#define PSERVER_TESTS_SERVER_SERVER_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/codec.h"
#include "gtest/gtest.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/shard.h"

namespace pserver {
namespace testing_util {

// "w" [3, 256] then "b" [256]: 1024 elements, one shard owns all of them.
inline v1::ModelLayout SmallLayout() {
  v1::ModelLayout l;
  v1::TensorSpec* w = l.add_tensors();
  w->set_name("w");
  w->add_shape(3);
  w->add_shape(256);
  v1::TensorSpec* b = l.add_tensors();
  b->set_name("b");
  b->add_shape(256);
  return l;
}
inline constexpr uint64_t kSmallElements = 1024;

// SGD with lr 1 and no momentum, fp32 pulls by default: x(t+1) = x(t) -
// mean(g), exactly in float, easy to check.
inline ShardConfig ExactSgdConfig(uint32_t workers,
                                  v1::Codec pull = v1::CODEC_FP32) {
  ShardConfig c;
  c.num_workers = workers;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = 1.0f;
  c.optimizer.momentum = 0.0f;
  c.pull_codec = pull;
  return c;
}

// 1-bit Adam at lr 1e-2 freezing at `freeze_step`, onebit pulls by default.
inline ShardConfig OneBitAdamConfig(uint32_t workers, uint64_t freeze_step,
                                    v1::Codec pull = v1::CODEC_ONEBIT) {
  ShardConfig c;
  c.num_workers = workers;
  c.optimizer.kind = OptimizerKind::kOneBitAdam;
  c.optimizer.lr = 1e-2f;
  c.optimizer.freeze_step = freeze_step;
  c.pull_codec = pull;
  return c;
}

inline std::vector<float> InitialWeights(uint64_t n) {
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  }
  return x;
}

// Deterministic pseudo-random gradient of (worker, step), values in
// [-scale/2, scale/2).
inline std::vector<float> Gradient(uint64_t n, uint32_t worker, uint64_t step,
                                   float scale = 1.0f) {
  std::vector<float> g(n);
  uint64_t z = 0x9E3779B97F4A7C15ULL * (step + 1) + 0xD1B54A32D192ED03ULL * (worker + 1);
  for (uint64_t i = 0; i < n; ++i) {
    z ^= z << 13;
    z ^= z >> 7;
    z ^= z << 17;
    g[i] = scale * (static_cast<float>(z >> 40) / (1 << 24) - 0.5f);
  }
  return g;
}

inline v1::EncodedTensor Fp32Tensor(absl::Span<const float> v) {
  v1::EncodedTensor t;
  t.set_codec(v1::CODEC_FP32);
  t.set_num_elements(v.size());
  t.mutable_payload()->resize(v.size() * sizeof(float));
  if (!v.empty()) {
    std::memcpy(t.mutable_payload()->data(), v.data(), v.size() * sizeof(float));
  }
  return t;
}

// Decodes any tensor to fp32 with the codec library.
inline std::vector<float> DecodeAll(const v1::EncodedTensor& t) {
  std::vector<float> out(t.num_elements(), 0.0f);
  auto codec = MakeDecoderFor(t);
  if (!codec.ok()) return {};
  if (!(*codec)->Decode(t, absl::MakeSpan(out)).ok()) return {};
  return out;
}

inline v1::RegisterRequest RegisterRequestFor(uint32_t worker,
                                              uint32_t num_workers,
                                              absl::Span<const float> x0) {
  v1::RegisterRequest r;
  r.set_worker_id(worker);
  r.set_num_workers(num_workers);
  r.set_shard_index(0);
  r.set_num_shards(1);
  *r.mutable_layout() = SmallLayout();
  *r.mutable_initial_weights() = Fp32Tensor(x0);
  return r;
}

// A shard with `layout` and every worker of `c` registered (worker 0
// installs x0).
inline std::unique_ptr<Shard> Registered(const ShardConfig& c,
                                  const v1::ModelLayout& layout,
                                  const std::vector<float>& x0) {
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(c, nullptr);
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return nullptr;
  for (uint32_t w = 0; w < c.num_workers; ++w) {
    v1::RegisterRequest r =
        RegisterRequestFor(w, c.num_workers, x0);
    *r.mutable_layout() = layout;
    absl::StatusOr<v1::RegisterResponse> resp = (*shard)->Register(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
  }
  return std::move(shard).value();
}

inline v1::PushRequest PushRequestFor(uint32_t worker, uint64_t step,
                                      v1::EncodedTensor gradient,
                                      v1::GradientSpace space =
                                          v1::GRADIENT_SPACE_RAW) {
  v1::PushRequest p;
  p.set_worker_id(worker);
  p.set_step(step);
  *p.mutable_gradient() = std::move(gradient);
  p.set_space(space);
  return p;
}

inline v1::PullRequest PullRequestFor(uint32_t worker, uint64_t step,
                                      int64_t replica_step,
                                      uint64_t replica_checksum,
                                      bool want_snapshot = false) {
  v1::PullRequest p;
  p.set_worker_id(worker);
  p.set_step(step);
  p.set_replica_step(replica_step);
  p.set_replica_checksum(replica_checksum);
  p.set_want_snapshot(want_snapshot);
  return p;
}

// A worker's replica of the shard, kept in sync through pull responses.
struct Replica {
  std::vector<float> x;
  int64_t step = -1;

  // Applies a pull response; returns false if it could not be decoded.
  bool Apply(const v1::PullResponse& r) {
    if (r.kind() == v1::PULL_KIND_SNAPSHOT) {
      x = DecodeAll(r.weights());
      if (x.size() != r.weights().num_elements()) return false;
    } else {
      auto codec = MakeDecoderFor(r.weights());
      if (!codec.ok()) return false;
      if (!(*codec)->DecodeAccumulate(r.weights(), 1.0f, absl::MakeSpan(x)).ok()) {
        return false;
      }
    }
    step = static_cast<int64_t>(r.step());
    return true;
  }
};

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_SERVER_SERVER_TEST_UTIL_H_
