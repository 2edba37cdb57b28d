// Pull answers (server/pull_answer.h, server/pull_answer_bytes.h): the
// hand-written serialization of MakePullAnswer is byte-for-byte protobuf's
// own; every buffer for one answer points at the same bytes (no copy per
// pull); the answer lives as long as a buffer does.
#include "server/pull_answer_bytes.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/pull_answer.h"

namespace pserver {
namespace {

v1::PullResponse Header(uint64_t step) {
  v1::PullResponse h;
  h.set_step(step);
  h.set_kind(v1::PULL_KIND_SNAPSHOT);
  h.set_replica_checksum(0x1234567890ABCDEFull);
  h.set_stage(v1::OPTIMIZER_STAGE_WARMUP);
  h.set_chunk(3);
  return h;
}

PullAnswer Answer(uint64_t step, size_t payload_bytes) {
  v1::EncodedTensor head;
  head.set_codec(v1::CODEC_FP32);
  head.set_num_elements(payload_bytes / 4);
  return MakePullAnswer(Header(step), head, std::string(payload_bytes, '\x42'));
}

// The one slice of a buffer made by PullAnswerBuffer.
grpc::Slice OnlySlice(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 1u);
  return slices.empty() ? grpc::Slice() : slices[0];
}

TEST(PullAnswer, SerializationIsProtobufsOwn) {
  // Payload sizes around the varint length boundaries (127/128, 16383/16384).
  for (size_t bytes : {size_t{0}, size_t{4}, size_t{124}, size_t{128},
                       size_t{16380}, size_t{16384}, size_t{1} << 20}) {
    v1::EncodedTensor head;
    head.set_codec(v1::CODEC_ONEBIT);
    head.set_num_elements(bytes * 8);
    head.mutable_params()->set_block_size(256);
    const std::string payload(bytes, '\x5A');
    PullAnswer a = MakePullAnswer(Header(9), head, payload);
    v1::PullResponse want = Header(9);
    *want.mutable_weights() = head;
    want.mutable_weights()->set_payload(payload);
    EXPECT_EQ(a->bytes, want.SerializeAsString()) << bytes;
    EXPECT_EQ(a->Parse().SerializeAsString(), want.SerializeAsString());
    EXPECT_EQ(a->payload_bytes, bytes);
    EXPECT_EQ(a->num_elements, bytes * 8);
    EXPECT_EQ(a->codec, v1::CODEC_ONEBIT);
  }
}

TEST(PullAnswerBytes, PullsOfOneAnswerShareOneSerialization) {
  PullAnswer answer = Answer(7, 1 << 20);
  std::vector<grpc::ByteBuffer> buffers;
  for (int i = 0; i < 40; ++i) buffers.push_back(PullAnswerBuffer(answer));
  const uint8_t* first = OnlySlice(buffers[0]).begin();
  EXPECT_EQ(first, reinterpret_cast<const uint8_t*>(answer->bytes.data()));
  for (const grpc::ByteBuffer& b : buffers) {
    EXPECT_EQ(OnlySlice(b).begin(), first);
  }
  grpc::Slice s = OnlySlice(buffers[0]);
  v1::PullResponse parsed;
  ASSERT_TRUE(parsed.ParseFromArray(s.begin(), static_cast<int>(s.size())));
  EXPECT_EQ(parsed.SerializeAsString(), answer->bytes);
}

TEST(PullAnswerBytes, AnswerLivesAsLongAsABufferDoes) {
  PullAnswer answer = Answer(1, 4096);
  std::weak_ptr<const PullChunk> weak = answer;
  grpc::ByteBuffer a = PullAnswerBuffer(answer);
  answer.reset();
  {
    grpc::ByteBuffer b = a;  // a copy shares the slice
    EXPECT_EQ(OnlySlice(a).begin(), OnlySlice(b).begin());
  }
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(a.Length(), weak.lock()->bytes.size());
  a.Clear();
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace pserver
