// CODEC_UNCHANGED (common/unchanged.h, common/impl/unchanged.cc): which
// pieces a sender marks, the decoder's checks, where the shard may accept
// them, and filling them back in.
#include "common/unchanged.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/tensor_codecs.h"
#include "common/validated_tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

// Parameter w [0, 300), buffers m [300, 400) and n [400, 420), parameter b
// [420, 500).
std::vector<TensorSlot> Slots() {
  std::vector<TensorSlot> s(4);
  s[0] = {"w", 0, 300, 30};
  s[1] = {"m", 300, 100, 10};
  s[1].buffer = true;
  s[2] = {"n", 400, 20, 0};
  s[2].buffer = true;
  s[3] = {"b", 420, 80, 0};
  return s;
}

std::vector<float> Ramp(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + 0.25f * static_cast<float>(i);
  return v;
}

// The 1-bit stream with exact buffers over slice `range`, as a worker
// encodes a push.
v1::EncodedTensor EncodeSlice(ShardRange range, uint64_t offset,
                              const std::vector<float>& u) {
  const std::vector<TensorSlot> slots = Slots();
  CodecPlan plan = CodecPlan::ForSlice(
      slots, range,
      WithExactBuffers(slots, std::vector<const Codec*>(slots.size())));
  v1::EncodedTensor t;
  EXPECT_TRUE(EncodeWithPlan(plan, *DecoderFor(v1::CODEC_ONEBIT), nullptr,
                             offset, u, 7, &t)
                  .ok());
  return t;
}

std::vector<float> Decoded(const v1::EncodedTensor& t) {
  std::vector<float> out(t.num_elements());
  EXPECT_TRUE(DecoderFor(t.codec())->Decode(t, absl::MakeSpan(out)).ok());
  return out;
}

TEST(BufferRanges, OnePerTensorInsideTheSlice) {
  EXPECT_EQ(BufferRanges(Slots(), {0, 500}),
            (ElementRanges{{300, 400}, {400, 420}}));
  // A slice starting inside m: slice-local, clipped.
  EXPECT_EQ(BufferRanges(Slots(), {350, 500}),
            (ElementRanges{{0, 50}, {50, 70}}));
  EXPECT_TRUE(BufferRanges(Slots(), {420, 500}).empty());
}

TEST(MarkUnchanged, MarksTheFp32BufferPiecesTheReceiverHolds) {
  const std::vector<float> u = Ramp(500, -40.0f);
  v1::EncodedTensor t = EncodeSlice({0, 500}, 0, u);
  ASSERT_EQ(t.codec(), v1::CODEC_SEGMENTS);
  const ElementRanges buffers = BufferRanges(Slots(), {0, 500});
  std::vector<float> held = u;
  held[310] += 1.0f;  // m differs from what the receiver holds
  const uint64_t marked = MarkUnchanged(
      &t, 0, buffers, [&](uint64_t begin, absl::string_view b) {
        return std::memcmp(b.data(), held.data() + begin, b.size()) == 0;
      });
  // Only n is marked: m's values differ, the parameters are not fp32. The
  // buffers' one fp32 piece is cut in two.
  EXPECT_EQ(marked, 20u);
  ASSERT_EQ(t.segments_size(), 4);
  EXPECT_EQ(t.segments(1).codec(), v1::CODEC_FP32);
  EXPECT_EQ(t.segments(1).num_elements(), 100u);
  int unchanged = 0;
  uint64_t at = 0;
  for (const v1::EncodedTensor& s : t.segments()) {
    if (s.codec() == v1::CODEC_UNCHANGED) {
      ++unchanged;
      EXPECT_EQ(at, 400u);
      EXPECT_EQ(s.num_elements(), 20u);
      EXPECT_TRUE(s.payload().empty());
    }
    at += s.num_elements();
  }
  EXPECT_EQ(unchanged, 1);
  EXPECT_TRUE(HasUnchanged(t));
  // The shard accepts it (a buffer), and filling it in gives the tensor the
  // sender would have sent.
  EXPECT_FALSE(UnchangedOutside(t, 0, buffers).has_value());
  FillUnchanged(&t, u);
  EXPECT_FALSE(HasUnchanged(t));
  EXPECT_EQ(Decoded(t), Decoded(EncodeSlice({0, 500}, 0, u)));
  // Both buffers the same: their piece is marked whole, not cut.
  v1::EncodedTensor both = EncodeSlice({0, 500}, 0, u);
  EXPECT_EQ(MarkUnchanged(&both, 0, buffers,
                          [](uint64_t, absl::string_view) { return true; }),
            120u);
  ASSERT_EQ(both.segments_size(), 3);
  EXPECT_EQ(both.segments(1).codec(), v1::CODEC_UNCHANGED);
}

TEST(MarkUnchanged, AWholeBufferChunkAndNoRanges) {
  // A chunk inside m: a plain fp32 tensor, marked whole.
  const std::vector<float> u = Ramp(50, 3.0f);
  v1::EncodedTensor t = EncodeSlice({0, 500}, 320, u);
  ASSERT_EQ(t.codec(), v1::CODEC_FP32);
  v1::EncodedTensor kept = t;
  EXPECT_EQ(MarkUnchanged(&kept, 320, {}, [](uint64_t, absl::string_view) {
              return true;
            }),
            0u);
  EXPECT_EQ(kept.codec(), v1::CODEC_FP32);
  EXPECT_EQ(MarkUnchanged(&t, 320, BufferRanges(Slots(), {0, 500}),
                          [](uint64_t, absl::string_view) { return true; }),
            50u);
  EXPECT_EQ(t.codec(), v1::CODEC_UNCHANGED);
  ASSERT_TRUE(ValidateTensor(t, 50).ok());
}

TEST(UnchangedOutside, NamesTheFirstParameterElement) {
  // An fp32 stream: w and b are fp32 pieces too, which a hostile sender
  // marks.
  v1::EncodedTensor t;
  t.set_codec(v1::CODEC_SEGMENTS);
  t.set_num_elements(500);
  for (uint64_t n : {300, 120, 80}) {
    v1::EncodedTensor* s = t.add_segments();
    s->set_codec(v1::CODEC_UNCHANGED);
    s->set_num_elements(n);
  }
  const ElementRanges buffers = BufferRanges(Slots(), {0, 500});
  std::optional<OutsidePiece> out = UnchangedOutside(t, 0, buffers);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->segment, 0);
  EXPECT_EQ(out->element, 0u);
  t.mutable_segments(0)->set_codec(v1::CODEC_FP32);
  t.mutable_segments(0)->set_payload(std::string(1200, '\0'));
  out = UnchangedOutside(t, 0, buffers);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->segment, 2);
  EXPECT_EQ(out->element, 420u);
  // A piece reaching one element past the buffers.
  v1::EncodedTensor whole;
  whole.set_codec(v1::CODEC_UNCHANGED);
  whole.set_num_elements(121);
  out = UnchangedOutside(whole, 300, buffers);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->segment, -1);
  EXPECT_EQ(out->element, 420u);
  whole.set_num_elements(120);
  EXPECT_FALSE(UnchangedOutside(whole, 300, buffers).has_value());
}

TEST(UnchangedDecoder, DecodesToZerosAndRefusesContent) {
  v1::EncodedTensor t;
  t.set_codec(v1::CODEC_UNCHANGED);
  t.set_num_elements(4);
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, 4);
  ASSERT_TRUE(v.ok()) << v.status();
  std::vector<float> out = {1, 2, 3, 4};
  v->AccumulateInto(1.0f, absl::MakeSpan(out));
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4}));  // a delta of zeros
  v->DecodeInto(absl::MakeSpan(out));
  EXPECT_EQ(out, (std::vector<float>(4, 0.0f)));
  const std::vector<float> base = {5, 6, 7, 8};
  v->AddInto(base, absl::MakeSpan(out));
  EXPECT_EQ(out, base);

  EXPECT_THAT(ValidateTensor(t, 5).status().message(),
              HasSubstr("num_elements is 4; expected 5"));
  t.set_payload("abcd");
  EXPECT_THAT(ValidateTensor(t, 4).status().message(),
              HasSubstr("payload holds 4 bytes; expected none for unchanged"));
  t.clear_payload();
  t.mutable_params()->set_block_size(8);
  EXPECT_THAT(ValidateTensor(t, 4).status().message(),
              HasSubstr("params is set; expected none for unchanged"));
  EXPECT_EQ(DecoderFor(v1::CODEC_UNCHANGED)
                ->Encode(base, 1, &t)
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(MakeCodec(v1::CODEC_UNCHANGED, {}).ok());
  EXPECT_EQ(CodecName(v1::CODEC_UNCHANGED), "unchanged");
}

TEST(AllZero, SignedZerosOnly) {
  const float zeros[] = {0.0f, -0.0f, 0.0f};
  EXPECT_TRUE(AllZero(absl::string_view(reinterpret_cast<const char*>(zeros),
                                        sizeof(zeros))));
  const float some[] = {0.0f, 1e-40f};
  EXPECT_FALSE(AllZero(absl::string_view(reinterpret_cast<const char*>(some),
                                         sizeof(some))));
}

}  // namespace
}  // namespace pserver
