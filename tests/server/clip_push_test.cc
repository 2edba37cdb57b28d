// Clipping the round's mean gradient on the shards (PushRequest.clip_norm,
// server/shard_clip.cc): a summed clipped round is held until a pull brings
// the model's squared mean norm; norm-part pulls answer this shard's part,
// at once or once the round is summed; the step applies torch's clip
// coefficient; bad values and mixed rounds are refused, nothing changed.
#include <cmath>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;

constexpr uint64_t kN = testing_util::kSmallElements;

v1::PushRequest Clipped(uint32_t w, uint64_t step, const std::vector<float>& g,
                        float clip) {
  v1::PushRequest p = PushRequestFor(w, step, Fp32Tensor(g));
  p.set_clip_norm(clip);
  return p;
}

v1::PullRequest NormPart(uint64_t step) {
  v1::PullRequest q = PullRequestFor(0, step, -1, 0);
  q.set_norm_part(true);
  return q;
}

double SquaredNorm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

TEST(ShardClip, AClippedRoundIsHeldUntilAPullBringsItsNorm) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = testing_util::Registered(
      testing_util::ExactSgdConfig(1), testing_util::SmallLayout(), x0);
  ASSERT_NE(shard, nullptr);
  const std::vector<float> g = Gradient(kN, 0, 0, 1.0f);
  ASSERT_TRUE(shard->Push(Clipped(0, 0, g, 1.0f)).ok());
  EXPECT_EQ(shard->Status().current_step(), 0u);  // held
  absl::StatusOr<v1::PullResponse> part =
      shard->PullBlocking(NormPart(1), absl::Seconds(5));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_NEAR(part->norm_part(), SquaredNorm(g), 1e-6 * SquaredNorm(g));
  EXPECT_EQ(shard->Status().current_step(), 0u);
  // The other shards' parts make the total four times this one's.
  const double total = 4 * part->norm_part();
  v1::PullRequest weights = PullRequestFor(0, 1, -1, 0, true);
  weights.set_round_squared_norm(total);
  absl::StatusOr<v1::PullResponse> r =
      shard->PullBlocking(weights, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(shard->Status().current_step(), 1u);
  const std::vector<float> x = testing_util::DecodeAll(r->weights());
  const double coef = 1.0 / (std::sqrt(total) + 1e-6);  // SGD at lr 1
  ASSERT_LT(coef, 1.0);
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(x[i], x0[i] - static_cast<float>(g[i] * coef), 1e-6) << i;
  }
  // A late norm-part pull of that round gets the same part.
  part = shard->PullBlocking(NormPart(1), absl::Seconds(5));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->norm_part(), total / 4);
}

TEST(ShardClip, ANormPartPullWaitsForTheLastPush) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = testing_util::Registered(
      testing_util::ExactSgdConfig(2), testing_util::SmallLayout(), x0);
  ASSERT_NE(shard, nullptr);
  const std::vector<float> a = Gradient(kN, 0, 0), b = Gradient(kN, 1, 0);
  ASSERT_TRUE(shard->Push(Clipped(0, 0, a, 10.0f)).ok());
  absl::Notification answered;
  double got = -1;
  const uint64_t id = shard->Pull(
      NormPart(1), [&](absl::Status s, PullAnswer answer) {
        EXPECT_TRUE(s.ok()) << s;
        v1::PullResponse resp;
        if (answer != nullptr) {
          ASSERT_TRUE(resp.ParseFromString(answer->bytes));
          got = resp.norm_part();
        }
        answered.Notify();
      });
  EXPECT_NE(id, 0u);  // parked
  EXPECT_FALSE(answered.HasBeenNotified());
  ASSERT_TRUE(shard->Push(Clipped(1, 0, b, 10.0f)).ok());
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(5)));
  std::vector<float> mean(kN);
  for (uint64_t i = 0; i < kN; ++i) mean[i] = (a[i] + b[i]) * 0.5f;
  EXPECT_NEAR(got, SquaredNorm(mean), 1e-6 * SquaredNorm(mean));
}

TEST(ShardClip, BadValuesAndMixedRoundsAreRefusedChangingNothing) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = testing_util::Registered(
      testing_util::ExactSgdConfig(2), testing_util::SmallLayout(), x0);
  ASSERT_NE(shard, nullptr);
  const std::vector<float> g = Gradient(kN, 0, 0);
  const uint64_t before = shard->Status().state_checksum();
  absl::StatusOr<v1::PushResponse> r = shard->Push(Clipped(0, 0, g, -1.0f));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "clip_norm is -1; expected a finite value > 0, or 0 for none");
  EXPECT_EQ(shard->Status().state_checksum(), before);
  ASSERT_TRUE(shard->Push(Clipped(0, 0, g, 1.0f)).ok());
  r = shard->Push(Clipped(1, 0, g, 0.0f));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "clip_norm is 0; round 0 has clip_norm 1 from its first push "
            "(every worker must clip the same)");
  ASSERT_TRUE(shard->Push(Clipped(1, 0, g, 1.0f)).ok());
  v1::PullRequest weights = PullRequestFor(1, 1, -1, 0, true);
  weights.set_round_squared_norm(std::nan(""));
  absl::StatusOr<v1::PullResponse> p =
      shard->PullBlocking(weights, absl::Seconds(5));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Status().current_step(), 0u);  // still held

  ShardConfig async = testing_util::ExactSgdConfig(1);
  async.consistency.mode = Consistency::kAsync;
  std::unique_ptr<Shard> relaxed =
      testing_util::Registered(async, testing_util::SmallLayout(), x0);
  ASSERT_NE(relaxed, nullptr);
  r = relaxed->Push(Clipped(0, 0, g, 1.0f));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "clip_norm is set; clipping the round's mean needs "
            "--consistency=bsp (clip per worker instead)");
  EXPECT_EQ(relaxed->Status().current_step(), 0u);
}

}  // namespace
}  // namespace pserver
