// Replica: a slice pulled in chunks is hashed as its chunks are staged, and
// FinishStage accepts exactly the slices whose bytes have the shard's
// checksum, whatever order the chunks came in or how often one was staged;
// compressed deltas are kept encoded and applied in place at Commit.
#include "worker/replica.h"

#include <cstring>
#include <memory>
#include <string>
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
  // Chunk 3 never staged this time: nothing verifies, neither the new
  // bytes' checksum, nor a short prefix's, nor one counting the bytes an
  // earlier update staged there.
  replica_.BeginUpdate();
  const std::vector<float> next = Values(kSlice, 5.0f);
  for (uint32_t c : {0, 1, 2}) StageChunk(c, next);
  std::vector<float> mixed = next;
  std::copy(want.begin() + 3 * kChunk, want.end(), mixed.begin() + 3 * kChunk);
  EXPECT_TRUE(absl::IsDataLoss(replica_.FinishStage(0, ChecksumOf(next))));
  EXPECT_TRUE(absl::IsDataLoss(replica_.FinishStage(0, ChecksumOf(mixed))));
  EXPECT_TRUE(absl::IsDataLoss(replica_.FinishStage(
      0, ChecksumOf(absl::MakeConstSpan(next).subspan(0, 3 * kChunk)))));
  EXPECT_FALSE(replica_.staged(0));
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

// A delta answer: `d` encoded with `codec`, then `later` each with it too.
v1::PullResponse Delta(v1::Codec codec, absl::Span<const float> d,
                       const std::vector<std::vector<float>>& later = {}) {
  v1::PullResponse r;
  r.set_kind(v1::PULL_KIND_DELTA);
  auto c = MakeCodec(codec, {});
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE((*c)->Encode(d, 1, r.mutable_weights()).ok());
  for (const std::vector<float>& l : later) {
    EXPECT_TRUE((*c)->Encode(l, 2, r.add_later_deltas()).ok());
  }
  return r;
}

// What a delta answer makes of `base`: base + decode(weights) + decode of
// each later delta, by the codec's own decoder.
std::vector<float> Applied(absl::Span<const float> base,
                           const v1::PullResponse& r) {
  std::vector<float> out(base.begin(), base.end());
  auto c = MakeCodec(r.weights().codec(), {});
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(
      (*c)->DecodeAccumulate(r.weights(), 1.0f, absl::MakeSpan(out)).ok());
  for (const v1::EncodedTensor& l : r.later_deltas()) {
    EXPECT_TRUE((*c)->DecodeAccumulate(l, 1.0f, absl::MakeSpan(out)).ok());
  }
  return out;
}

std::vector<float> Concat(const std::vector<float>& a,
                          const std::vector<float>& b) {
  std::vector<float> v = a;
  v.insert(v.end(), b.begin(), b.end());
  return v;
}

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Compressed deltas are kept encoded and applied at Commit: in any chunk
// order, restaged or not, the slice verifies against the bytes of base +
// delta and Commit makes exactly those bytes the replica; nothing
// model-sized is allocated for them. fp32 deltas go through the staging
// buffer, which stays while the pulls are such deltas; a snapshot's
// commit releases it.
TEST_F(ReplicaChunks, CompressedDeltasAreAppliedInPlaceAtCommit) {
  const std::vector<float> a = Values(kSlice, 2.0f), b = Values(700, 7.0f);
  ASSERT_TRUE(replica_.StageChunk(0, 0, kSlice, Snapshot(a)).ok());
  ASSERT_TRUE(replica_.StageChunk(1, 0, 700, Snapshot(b)).ok());
  ASSERT_TRUE(replica_.FinishStage(0, ChecksumOf(a)).ok());
  ASSERT_TRUE(replica_.FinishStage(1, ChecksumOf(b)).ok());
  EXPECT_TRUE(replica_.has_staging_buffer());
  replica_.Commit(1);
  EXPECT_TRUE(replica_.has_staging_buffer()) << "swapped in, kept";
  std::vector<float> now = Concat(a, b);
  ASSERT_TRUE(SameBits(replica_.weights(), now));

  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(step);
    // Shard 0 in 4 chunks (out of order, chunk 1 staged twice, the second
    // time with a later delta), shard 1 whole, all 1-bit.
    replica_.BeginUpdate();
    std::vector<float> want(now.begin(), now.end());
    const std::vector<float> d = Values(1700, -0.5f * step);
    std::vector<v1::PullResponse> answers;
    for (uint32_t c = 0; c < 4; ++c) {
      const uint64_t b0 = c * kChunk, n = std::min(kChunk, kSlice - b0);
      const auto part = absl::MakeConstSpan(d).subspan(b0, n);
      answers.push_back(c == 1 ? Delta(v1::CODEC_ONEBIT, part,
                                       {Values(n, 0.125f)})
                               : Delta(v1::CODEC_ONEBIT, part));
      const std::vector<float> got =
          Applied(absl::MakeConstSpan(now).subspan(b0, n), answers.back());
      std::copy(got.begin(), got.end(), want.begin() + b0);
    }
    for (uint32_t c : {2, 1, 0, 3}) {
      const uint64_t b0 = c * kChunk, n = std::min(kChunk, kSlice - b0);
      ASSERT_TRUE(replica_.StageChunk(0, b0, n,
                                      c == 1 ? Delta(v1::CODEC_ONEBIT,
                                                     absl::MakeConstSpan(d)
                                                         .subspan(b0, n))
                                             : answers[c])
                      .ok());
    }
    ASSERT_TRUE(replica_.StageChunk(0, kChunk, kChunk, answers[1]).ok());
    const v1::PullResponse whole =
        Delta(v1::CODEC_ONEBIT, absl::MakeConstSpan(d).subspan(kSlice, 700));
    ASSERT_TRUE(replica_.StageChunk(1, 0, 700, whole).ok());
    const std::vector<float> w1 =
        Applied(absl::MakeConstSpan(now).subspan(kSlice, 700), whole);
    std::copy(w1.begin(), w1.end(), want.begin() + kSlice);

    const auto want0 = absl::MakeConstSpan(want).subspan(0, kSlice);
    EXPECT_TRUE(
        absl::IsDataLoss(replica_.FinishStage(0, ChecksumOf(want0) ^ 1)));
    ASSERT_TRUE(replica_.FinishStage(0, ChecksumOf(want0)).ok());
    ASSERT_TRUE(replica_
                    .FinishStage(1, ChecksumOf(absl::MakeConstSpan(want)
                                                   .subspan(kSlice, 700)))
                    .ok());
    EXPECT_TRUE(SameBits(replica_.weights(), now)) << "changed before Commit";
    replica_.Commit(1 + step);
    EXPECT_FALSE(replica_.has_staging_buffer()) << "kept, unused";
    EXPECT_TRUE(SameBits(replica_.weights(), want));
    EXPECT_EQ(replica_.checksum(0), ChecksumOf(want0));
    now = want;
  }

  // fp32 deltas (4 bytes an element) are staged: the buffer stays between
  // such commits (as between fp32 pulls, which are snapshots).
  for (int step = 4; step <= 5; ++step) {
    replica_.BeginUpdate();
    const std::vector<float> d = Values(1700, 0.25f * step);
    std::vector<float> want(now.size());
    for (size_t s = 0; s < 2; ++s) {
      const uint64_t b0 = s == 0 ? 0 : kSlice, n = s == 0 ? kSlice : 700;
      const v1::PullResponse r =
          Delta(v1::CODEC_FP32, absl::MakeConstSpan(d).subspan(b0, n));
      ASSERT_TRUE(replica_.StageChunk(s, 0, n, r).ok());
      const std::vector<float> got =
          Applied(absl::MakeConstSpan(now).subspan(b0, n), r);
      std::copy(got.begin(), got.end(), want.begin() + b0);
      ASSERT_TRUE(replica_
                      .FinishStage(s, ChecksumOf(absl::MakeConstSpan(want)
                                                     .subspan(b0, n)))
                      .ok());
    }
    EXPECT_TRUE(SameBits(replica_.weights(), now));
    replica_.Commit(1 + step);
    EXPECT_TRUE(SameBits(replica_.weights(), want));
    EXPECT_TRUE(replica_.has_staging_buffer());
    now = want;
  }

  // A snapshot of shard 0 beside a 1-bit delta of shard 1 (a restarted
  // shard): both applied; the buffer stays until an update does not use it
  // or ReleaseStaging.
  replica_.BeginUpdate();
  const std::vector<float> fresh = Values(kSlice, 9.0f);
  const v1::PullResponse delta1 =
      Delta(v1::CODEC_ONEBIT, Values(700, 0.75f));
  ASSERT_TRUE(replica_.StageChunk(0, 0, kSlice, Snapshot(fresh)).ok());
  ASSERT_TRUE(replica_.StageChunk(1, 0, 700, delta1).ok());
  std::vector<float> want = Concat(
      fresh, Applied(absl::MakeConstSpan(now).subspan(kSlice, 700), delta1));
  ASSERT_TRUE(replica_.FinishStage(0, ChecksumOf(fresh)).ok());
  ASSERT_TRUE(replica_
                  .FinishStage(1, ChecksumOf(absl::MakeConstSpan(want)
                                                 .subspan(kSlice, 700)))
                  .ok());
  replica_.Commit(7);
  EXPECT_TRUE(SameBits(replica_.weights(), want));
  EXPECT_TRUE(replica_.has_staging_buffer());
  replica_.ReleaseStaging();
  EXPECT_FALSE(replica_.has_staging_buffer());
  EXPECT_TRUE(SameBits(replica_.weights(), want));
}

// A kept delta that does not validate is refused and leaves the shard
// unstaged; the replica is untouched.
TEST_F(ReplicaChunks, ABadCompressedDeltaIsRefused) {
  v1::PullResponse r = Delta(v1::CODEC_ONEBIT, Values(kSlice, 1.0f));
  r.mutable_weights()->mutable_payload()->resize(10);
  EXPECT_TRUE(absl::IsInvalidArgument(replica_.StageChunk(0, 0, kSlice, r)));
  v1::PullResponse later =
      Delta(v1::CODEC_ONEBIT, Values(kSlice, 1.0f), {Values(kSlice, 2.0f)});
  later.mutable_later_deltas(0)->set_num_elements(3);
  absl::Status st = replica_.StageChunk(0, 0, kSlice, later);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("later_deltas[0]"), std::string::npos) << st;
  EXPECT_FALSE(replica_.staged(0));
  EXPECT_TRUE(SameBits(replica_.weights(), std::vector<float>(1700, 0.0f)));
}

// A CURRENT answer keeps the replica's own values: the slice the replica
// assumed verifies against their checksum and Commit changes nothing; one
// whose checksum is another's does not verify; one carrying weights is
// refused.
TEST_F(ReplicaChunks, ACurrentAnswerKeepsTheAssumedWeights) {
  const std::vector<float> w = Values(1700, 3.0f);
  replica_.Assume(w);
  EXPECT_TRUE(SameBits(replica_.weights(), w));
  const uint64_t sum0 = ChecksumOf(absl::MakeConstSpan(w).subspan(0, kSlice));
  EXPECT_EQ(replica_.checksum(0), sum0);
  v1::PullResponse cur;
  cur.set_kind(v1::PULL_KIND_CURRENT);
  replica_.BeginUpdate();
  for (uint64_t b = 0; b < kSlice; b += kChunk) {
    ASSERT_TRUE(
        replica_.StageChunk(0, b, std::min(kChunk, kSlice - b), cur).ok());
  }
  ASSERT_TRUE(replica_.FinishStage(0, sum0).ok());
  ASSERT_TRUE(replica_.StageChunk(1, 0, 700, cur).ok());
  EXPECT_TRUE(absl::IsDataLoss(replica_.FinishStage(1, sum0)));
  ASSERT_TRUE(replica_.StageChunk(1, 0, 700, cur).ok());
  ASSERT_TRUE(replica_
                  .FinishStage(1, ChecksumOf(absl::MakeConstSpan(w).subspan(
                                      kSlice, 700)))
                  .ok());
  replica_.Commit(1);
  EXPECT_TRUE(SameBits(replica_.weights(), w));
  EXPECT_FALSE(replica_.has_staging_buffer());

  v1::PullResponse bad = cur;
  bad.mutable_weights()->set_payload("abcd");
  replica_.BeginUpdate();
  absl::Status st = replica_.StageChunk(0, 0, kSlice, bad);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("PULL_KIND_CURRENT"), std::string::npos) << st;
  EXPECT_FALSE(replica_.staged(0));
}

}  // namespace
}  // namespace pserver
