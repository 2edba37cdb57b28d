// Replica: a slice pulled in chunks is hashed as its chunks are staged, and
// FinishStage accepts exactly the slices whose bytes have the shard's
// checksum, whatever order the chunks came in or how often one was staged.
#include "worker/replica.h"

#include <memory>
#include <vector>

#include "common/checksum.h"
#include "common/codec.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

constexpr uint64_t kSlice = 1000;  // shard 0: [0, 1000); shard 1: [1000, 1700)
constexpr uint64_t kChunk = 256;   // chunks of 256, the last one 232

std::vector<float> Values(uint64_t n, float base) {
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = base + 0.25f * static_cast<float>(i % 97);
  return v;
}

// A snapshot answer holding `v` (fp32).
v1::PullResponse Snapshot(absl::Span<const float> v) {
  v1::PullResponse r;
  r.set_kind(v1::PULL_KIND_SNAPSHOT);
  auto fp32 = MakeCodec(v1::CODEC_FP32, {});
  EXPECT_TRUE(fp32.ok());
  EXPECT_TRUE((*fp32)->Encode(v, 1, r.mutable_weights()).ok());
  return r;
}

class ReplicaChunks : public ::testing::Test {
 protected:
  void SetUp() override {
    replica_.Reset(1700, {ShardRange{0, kSlice}, ShardRange{kSlice, 1700}}, 0);
    replica_.BeginUpdate();
  }
  // Stages chunk c of shard 0 holding want's elements of that chunk.
  void StageChunk(uint32_t c, const std::vector<float>& want) {
    const uint64_t b = c * kChunk, n = std::min(kChunk, kSlice - b);
    ASSERT_TRUE(replica_
                    .StageChunk(0, b, n,
                                Snapshot(absl::MakeConstSpan(want).subspan(b, n)))
                    .ok());
  }
  Replica replica_;
};

TEST_F(ReplicaChunks, InOrderOutOfOrderAndMissingChunks) {
  const std::vector<float> want = Values(kSlice, 1.0f);
  const uint64_t sum = ChecksumOf(want);
  for (const std::vector<uint32_t>& order :
       std::vector<std::vector<uint32_t>>{{0, 1, 2, 3}, {2, 0, 3, 1},
                                          {3, 2, 1, 0}, {1, 3, 0, 2}}) {
    SCOPED_TRACE(order[0] * 1000 + order[1] * 100 + order[2] * 10 + order[3]);
    replica_.BeginUpdate();
    for (uint32_t c : order) StageChunk(c, want);
    absl::Status bad = replica_.FinishStage(0, sum ^ 1);
    EXPECT_TRUE(absl::IsDataLoss(bad)) << bad;
    EXPECT_FALSE(replica_.staged(0));
    // The refused FinishStage leaves the staged bytes: hashed whole now.
    EXPECT_TRUE(replica_.FinishStage(0, sum).ok());
    EXPECT_TRUE(replica_.staged(0));
  }
  // Chunk 3 never staged this time: the slice holds its old bytes there,
  // and the checksum must be of those bytes, not of a short prefix.
  replica_.BeginUpdate();
  const std::vector<float> next = Values(kSlice, 5.0f);
  for (uint32_t c : {0, 1, 2}) StageChunk(c, next);
  std::vector<float> mixed = next;
  std::copy(want.begin() + 3 * kChunk, want.end(), mixed.begin() + 3 * kChunk);
  EXPECT_TRUE(absl::IsDataLoss(replica_.FinishStage(0, ChecksumOf(next))));
  EXPECT_TRUE(replica_.FinishStage(0, ChecksumOf(mixed)).ok());
}

TEST_F(ReplicaChunks, AChunkStagedAgainCountsWithItsLastBytes) {
  const std::vector<float> first = Values(kSlice, 1.0f);
  std::vector<float> last = first;
  const std::vector<float> other = Values(kSlice, -3.0f);
  std::copy(other.begin() + kChunk, other.begin() + 2 * kChunk,
            last.begin() + kChunk);
  // Chunk 1 is hashed (0 and 1 are in order), then staged again with other
  // bytes: the running hash is stale.
  for (uint32_t c : {0, 1, 2}) StageChunk(c, first);
  StageChunk(1, other);
  StageChunk(3, first);
  EXPECT_TRUE(absl::IsDataLoss(replica_.FinishStage(0, ChecksumOf(first))));
  EXPECT_TRUE(replica_.FinishStage(0, ChecksumOf(last)).ok());

  // Chunk 0 again starts the answer over: chunks hashed before it no longer
  // count, so all must come again (here they do not: hashed whole).
  replica_.BeginUpdate();
  for (uint32_t c : {0, 1, 2, 3}) StageChunk(c, first);
  StageChunk(0, other);
  std::vector<float> head = first;
  std::copy(other.begin(), other.begin() + kChunk, head.begin());
  EXPECT_TRUE(replica_.FinishStage(0, ChecksumOf(head)).ok());

  // A chunk staged twice before it is hashed (2 waits for 1) counts once.
  replica_.BeginUpdate();
  StageChunk(0, first);
  StageChunk(2, other);
  StageChunk(2, first);
  StageChunk(1, first);
  StageChunk(3, first);
  EXPECT_TRUE(replica_.FinishStage(0, ChecksumOf(first)).ok());
}

TEST_F(ReplicaChunks, ShardsHashTheirOwnSlices) {
  const std::vector<float> a = Values(kSlice, 2.0f), b = Values(700, 7.0f);
  StageChunk(0, a);
  ASSERT_TRUE(replica_.StageChunk(1, 0, 700, Snapshot(b)).ok());
  for (uint32_t c : {1, 2, 3}) StageChunk(c, a);
  EXPECT_TRUE(replica_.FinishStage(1, ChecksumOf(b)).ok());
  EXPECT_TRUE(replica_.FinishStage(0, ChecksumOf(a)).ok());
  replica_.Commit(1);
  EXPECT_EQ(replica_.checksum(0), ChecksumOf(a));
  EXPECT_EQ(replica_.checksum(1), ChecksumOf(b));
}

}  // namespace
}  // namespace pserver
