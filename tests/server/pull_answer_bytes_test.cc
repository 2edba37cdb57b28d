// PullAnswerBytes: every buffer for one shared answer points at the same
// serialized bytes (no copy per pull), the bytes are the answer's
// serialization, and they are freed with the last buffer.
#include "server/pull_answer_bytes.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {
namespace {

PullAnswer Answer(uint64_t step, size_t payload_bytes) {
  auto r = std::make_shared<v1::PullResponse>();
  r->set_step(step);
  r->set_kind(v1::PULL_KIND_SNAPSHOT);
  r->mutable_weights()->set_codec(v1::CODEC_FP32);
  r->mutable_weights()->set_num_elements(payload_bytes / 4);
  r->mutable_weights()->set_payload(std::string(payload_bytes, '\x42'));
  return r;
}

// The one slice of a buffer made by PullAnswerBytes.
grpc::Slice OnlySlice(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 1u);
  return slices.empty() ? grpc::Slice() : slices[0];
}

TEST(PullAnswerBytes, PullsOfOneAnswerShareOneSerialization) {
  PullAnswerBytes bytes;
  PullAnswer answer = Answer(7, 1 << 20);
  std::vector<grpc::ByteBuffer> buffers;
  for (int i = 0; i < 40; ++i) buffers.push_back(bytes.Get(answer));
  EXPECT_EQ(bytes.live_serializations(), 1);
  const uint8_t* first = OnlySlice(buffers[0]).begin();
  for (const grpc::ByteBuffer& b : buffers) {
    EXPECT_EQ(OnlySlice(b).begin(), first);
  }
  grpc::Slice s = OnlySlice(buffers[0]);
  v1::PullResponse parsed;
  ASSERT_TRUE(parsed.ParseFromArray(s.begin(), static_cast<int>(s.size())));
  EXPECT_EQ(parsed.SerializeAsString(), answer->SerializeAsString());
}

TEST(PullAnswerBytes, BytesLiveAsLongAsABufferDoes) {
  PullAnswerBytes bytes;
  PullAnswer answer = Answer(1, 4096);
  {
    grpc::ByteBuffer a = bytes.Get(answer);
    {
      grpc::ByteBuffer b = bytes.Get(answer);
      EXPECT_EQ(OnlySlice(a).begin(), OnlySlice(b).begin());
    }
    EXPECT_EQ(bytes.live_serializations(), 1);
  }
  EXPECT_EQ(bytes.live_serializations(), 0);
  // Serialized again on demand, still correct.
  grpc::ByteBuffer again = bytes.Get(answer);
  EXPECT_EQ(again.Length(), answer->ByteSizeLong());
}

TEST(PullAnswerBytes, DifferentAnswersGetTheirOwnBytes) {
  PullAnswerBytes bytes;
  PullAnswer delta = Answer(3, 128);
  PullAnswer snapshot = Answer(3, 4096);
  grpc::ByteBuffer d = bytes.Get(delta);
  grpc::ByteBuffer s = bytes.Get(snapshot);
  EXPECT_EQ(bytes.live_serializations(), 2);
  EXPECT_EQ(d.Length(), delta->ByteSizeLong());
  EXPECT_EQ(s.Length(), snapshot->ByteSizeLong());
  // A new answer (possibly at the freed one's address) is not mistaken
  // for it: its bytes are its own.
  grpc::ByteBuffer kept = bytes.Get(delta);
  delta.reset();
  PullAnswer next = Answer(4, 256);
  EXPECT_EQ(bytes.Get(next).Length(), next->ByteSizeLong());
}

}  // namespace
}  // namespace pserver
