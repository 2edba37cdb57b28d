// Per-tensor codecs: CodecPlan over a shard's slice, EncodeWithPlan (plain
// tensors inside one piece, CODEC_SEGMENTS across pieces, error feedback per
// piece) and the segments decoder's checks on hostile tensors.
#include "common/tensor_codecs.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/mix.h"
#include "common/validated_tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Codec> Make(v1::Codec id, uint32_t bits = 0) {
  v1::CodecParams p;
  if (bits != 0) p.set_bits(bits);
  auto c = MakeCodec(id, p);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::vector<float> Ramp(size_t n, float scale = 0.01f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = scale * static_cast<float>((static_cast<int>(i * 37 % 101)) - 50);
  }
  return v;
}

// Tensors a [0, 300), b [300, 817), c [817, 894), d [894, 895).
std::vector<TensorSlot> Slots() {
  return {{"a", 0, 300}, {"b", 300, 517}, {"c", 817, 77}, {"d", 894, 1}};
}

class TensorCodecsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Codec> fp32_ = Make(v1::CODEC_FP32);
  std::unique_ptr<Codec> onebit_ = Make(v1::CODEC_ONEBIT);
  std::unique_ptr<Codec> q4_ = Make(v1::CODEC_QUANTIZE, 4);
};

TEST_F(TensorCodecsTest, PlanCutsTheSliceAtTensorsWithTheirOwnCodec) {
  // b has fp32, c quantize; a and d the stream's codec.
  std::vector<const Codec*> codecs = {nullptr, fp32_.get(), q4_.get(),
                                      nullptr};
  CodecPlan whole = CodecPlan::ForSlice(Slots(), {0, 895}, codecs);
  ASSERT_FALSE(whole.uniform());
  std::vector<CodecPiece> pieces;
  whole.Cut(0, 895, &pieces);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].end, 300u);
  EXPECT_EQ(pieces[0].codec, nullptr);
  EXPECT_EQ(pieces[1].codec, fp32_.get());
  EXPECT_EQ(pieces[2].begin, 817u);
  EXPECT_EQ(pieces[2].codec, q4_.get());
  EXPECT_EQ(pieces[3].begin, 894u);
  // A span inside b is one piece; one across a and b two, clipped.
  whole.Cut(400, 100, &pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].codec, fp32_.get());
  whole.Cut(250, 100, &pieces);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].begin, 250u);
  EXPECT_EQ(pieces[0].end, 300u);
  EXPECT_EQ(pieces[1].end, 350u);

  // A second shard's slice [512, 895): in slice coordinates, b's rest
  // [0, 305), then c and d.
  CodecPlan second = CodecPlan::ForSlice(Slots(), {512, 895}, codecs);
  second.Cut(0, 383, &pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].end, 305u);
  EXPECT_EQ(pieces[0].codec, fp32_.get());
  EXPECT_EQ(pieces[1].begin, 305u);
  EXPECT_EQ(pieces[2].begin, 382u);
  // A slice where nothing has its own codec is uniform: [0, 256) holds
  // only a.
  EXPECT_TRUE(CodecPlan::ForSlice(Slots(), {0, 256}, codecs).uniform());
  std::vector<const Codec*> none(4, nullptr);
  EXPECT_TRUE(CodecPlan::ForSlice(Slots(), {0, 895}, none).uniform());
  // Neighbours with the same codec merge.
  std::vector<const Codec*> same = {q4_.get(), q4_.get(), nullptr, nullptr};
  CodecPlan merged = CodecPlan::ForSlice(Slots(), {0, 895}, same);
  merged.Cut(0, 895, &pieces);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].end, 817u);
}

TEST_F(TensorCodecsTest, UniformPlanEncodesExactlyAsTheStreamCodec) {
  const std::vector<float> g = Ramp(895);
  ErrorFeedback plain(onebit_.get(), 895);
  ErrorFeedback planned(onebit_.get(), 895);
  for (int step = 0; step < 3; ++step) {
    v1::EncodedTensor a, b;
    ASSERT_TRUE(plain.EncodeAt(0, g, 7 + step, &a).ok());
    ASSERT_TRUE(EncodeWithPlan(CodecPlan(), planned.codec(), &planned, 0, g,
                               7 + step, &b)
                    .ok());
    EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  }
  EXPECT_EQ(std::vector<float>(plain.residual().begin(), plain.residual().end()),
            std::vector<float>(planned.residual().begin(),
                               planned.residual().end()));
}

TEST_F(TensorCodecsTest, ChunkAcrossTensorsIsSegmentsWithFeedbackPerPiece) {
  std::vector<const Codec*> codecs = {nullptr, fp32_.get(), q4_.get(),
                                      nullptr};
  CodecPlan plan = CodecPlan::ForSlice(Slots(), {0, 895}, codecs);
  const std::vector<float> g = Ramp(895);
  ErrorFeedback ef(onebit_.get(), 895);
  // The reference: each piece encoded on its own by its own codec, with an
  // error feedback of its own.
  ErrorFeedback ref_a(onebit_.get(), 300), ref_c(q4_.get(), 77),
      ref_d(onebit_.get(), 1);
  const uint64_t seed = 99;
  for (int step = 0; step < 3; ++step) {
    v1::EncodedTensor t;
    ASSERT_TRUE(EncodeWithPlan(plan, ef.codec(), &ef, 0, g, seed, &t).ok());
    ASSERT_EQ(t.codec(), v1::CODEC_SEGMENTS);
    ASSERT_EQ(t.num_elements(), 895u);
    ASSERT_EQ(t.segments_size(), 4);
    EXPECT_EQ(t.segments(0).codec(), v1::CODEC_ONEBIT);
    EXPECT_EQ(t.segments(1).codec(), v1::CODEC_FP32);
    EXPECT_EQ(t.segments(2).codec(), v1::CODEC_QUANTIZE);
    EXPECT_EQ(t.segments(3).codec(), v1::CODEC_ONEBIT);
    v1::EncodedTensor ra, rc, rd;
    absl::Span<const float> gs(g);
    ASSERT_TRUE(ref_a.Encode(gs.subspan(0, 300), MixPair(seed, 0), &ra)
                    .ok());
    ASSERT_TRUE(ref_c.Encode(gs.subspan(817, 77), MixPair(seed, 2), &rc)
                    .ok());
    ASSERT_TRUE(ref_d.Encode(gs.subspan(894, 1), MixPair(seed, 3), &rd)
                    .ok());
    EXPECT_EQ(t.segments(0).SerializeAsString(), ra.SerializeAsString());
    EXPECT_EQ(t.segments(2).SerializeAsString(), rc.SerializeAsString());
    EXPECT_EQ(t.segments(3).SerializeAsString(), rd.SerializeAsString());
    // Decoding the whole: b comes back exactly (fp32), the rest as their
    // codecs decode them.
    absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, 895);
    ASSERT_TRUE(v.ok()) << v.status();
    std::vector<float> out(895);
    v->DecodeInto(absl::MakeSpan(out));
    for (size_t i = 300; i < 817; ++i) ASSERT_EQ(out[i], g[i]) << i;
    std::vector<float> da(300);
    ASSERT_TRUE(onebit_->Decode(ra, absl::MakeSpan(da)).ok());
    for (size_t i = 0; i < 300; ++i) ASSERT_EQ(out[i], da[i]) << i;
  }
  // The residual of each piece is its reference's; b's (fp32) is zero.
  absl::Span<const float> e = ef.residual();
  ASSERT_EQ(e.size(), 895u);
  for (size_t i = 0; i < 300; ++i) ASSERT_EQ(e[i], ref_a.residual()[i]) << i;
  for (size_t i = 300; i < 817; ++i) ASSERT_EQ(e[i], 0.0f) << i;
  for (size_t i = 0; i < 77; ++i) {
    ASSERT_EQ(e[817 + i], ref_c.residual()[i]) << i;
  }
}

TEST_F(TensorCodecsTest, NonFiniteInputLeavesEveryPieceResidualUnchanged) {
  std::vector<const Codec*> codecs = {nullptr, q4_.get(), nullptr, nullptr};
  CodecPlan plan = CodecPlan::ForSlice(Slots(), {0, 895}, codecs);
  ErrorFeedback ef(onebit_.get(), 895);
  std::vector<float> g = Ramp(895);
  v1::EncodedTensor t;
  ASSERT_TRUE(EncodeWithPlan(plan, ef.codec(), &ef, 0, g, 1, &t).ok());
  const std::vector<float> before(ef.residual().begin(), ef.residual().end());
  g[850] = std::numeric_limits<float>::quiet_NaN();  // in the last piece
  absl::Status s = EncodeWithPlan(plan, ef.codec(), &ef, 0, g, 2, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("850"));
  EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()),
            before);
  // A span beyond the plan's slice is refused, not half-encoded.
  std::vector<float> longer(200, 0.5f);
  s = EncodeWithPlan(plan, ef.codec(), &ef, 800, longer, 3, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

// a is 3 x 100, c 7 x 11: rows of 100 and 11.
std::vector<TensorSlot> RowSlots() {
  return {{"a", 0, 300, 100}, {"b", 300, 517, 0}, {"c", 817, 77, 11},
          {"d", 894, 1, 0}};
}

std::unique_ptr<Codec> BlockTopK() {
  v1::CodecParams p;
  p.set_block_size(4);
  p.set_k_fraction(0.1);
  auto c = MakeCodec(v1::CODEC_BLOCK_TOPK, p);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

TEST_F(TensorCodecsTest, BlockTopKKeepsItsBlocksInTheRowsOfEachTensor) {
  const std::vector<const Codec*> none(4, nullptr);
  std::unique_ptr<Codec> blocks = BlockTopK();
  const std::vector<float> g = Ramp(895);
  CodecPlan plan = CodecPlan::ForSlice(RowSlots(), {0, 895}, none);
  EXPECT_TRUE(plan.uniform());  // no tensor has a codec of its own
  v1::EncodedTensor t;
  ASSERT_TRUE(EncodeWithPlan(plan, *blocks, nullptr, 0, g, 5, &t).ok());
  ASSERT_EQ(t.codec(), v1::CODEC_SEGMENTS);
  ASSERT_EQ(t.segments_size(), 4);
  EXPECT_EQ(t.segments(0).num_elements(), 300u);
  EXPECT_EQ(t.segments(0).params().row_length(), 100u);
  EXPECT_EQ(t.segments(1).params().row_length(), 0u);  // a vector
  EXPECT_EQ(t.segments(2).params().row_length(), 11u);
  EXPECT_EQ(t.segments(3).params().row_length(), 0u);
  // Each segment is what block_topk with those rows makes of its piece.
  v1::CodecParams rows = blocks->params();
  rows.set_row_length(100);
  auto a_codec = MakeCodec(v1::CODEC_BLOCK_TOPK, rows);
  ASSERT_TRUE(a_codec.ok());
  v1::EncodedTensor a;
  ASSERT_TRUE(
      (*a_codec)->Encode(absl::MakeConstSpan(g).subspan(0, 300), MixPair(5, 0), &a)
          .ok());
  EXPECT_EQ(t.segments(0).SerializeAsString(), a.SerializeAsString());
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, 895);
  ASSERT_TRUE(v.ok()) << v.status();

  // A piece cut mid-row runs over the flat span, merged with its flat
  // neighbour: [250, 300) of a and [300, 350) of b are one plain tensor.
  std::vector<float> part(g.begin() + 250, g.begin() + 350);
  ASSERT_TRUE(EncodeWithPlan(plan, *blocks, nullptr, 250, part, 5, &t).ok());
  EXPECT_EQ(t.codec(), v1::CODEC_BLOCK_TOPK);
  EXPECT_EQ(t.params().row_length(), 0u);

  // A slice that starts inside a, at a row: [200, 895) holds a's last row.
  CodecPlan later = CodecPlan::ForSlice(RowSlots(), {200, 895}, none);
  std::vector<float> rest(g.begin() + 200, g.end());
  ASSERT_TRUE(EncodeWithPlan(later, *blocks, nullptr, 0, rest, 5, &t).ok());
  ASSERT_EQ(t.codec(), v1::CODEC_SEGMENTS);
  EXPECT_EQ(t.segments(0).num_elements(), 100u);
  EXPECT_EQ(t.segments(0).params().row_length(), 100u);
  // One that starts mid-row: the partial row runs flat, the whole rows
  // after it keep their rows.
  CodecPlan head = CodecPlan::ForSlice(RowSlots(), {150, 895}, none);
  std::vector<float> rest1(g.begin() + 150, g.end());
  ASSERT_TRUE(EncodeWithPlan(head, *blocks, nullptr, 0, rest1, 5, &t).ok());
  ASSERT_EQ(t.codec(), v1::CODEC_SEGMENTS);
  ASSERT_EQ(t.segments_size(), 5);
  EXPECT_EQ(t.segments(0).num_elements(), 50u);
  EXPECT_EQ(t.segments(0).params().row_length(), 0u);
  EXPECT_EQ(t.segments(1).num_elements(), 100u);
  EXPECT_EQ(t.segments(1).params().row_length(), 100u);
  EXPECT_EQ(t.segments(2).num_elements(), 517u);
  // Less than a row of a: nothing keeps rows there.
  CodecPlan mid = CodecPlan::ForSlice(RowSlots(), {256, 895}, none);
  std::vector<float> rest2(g.begin() + 256, g.end());
  ASSERT_TRUE(EncodeWithPlan(mid, *blocks, nullptr, 0, rest2, 5, &t).ok());
  ASSERT_EQ(t.codec(), v1::CODEC_SEGMENTS);
  EXPECT_EQ(t.segments(0).num_elements(), 44u + 517u);  // a's tail and b
  EXPECT_EQ(t.segments(0).params().row_length(), 0u);

  // Other codecs are not cut at tensors: the layout changes nothing.
  ErrorFeedback plain(onebit_.get(), 895), planned(onebit_.get(), 895);
  v1::EncodedTensor x, y;
  ASSERT_TRUE(plain.EncodeAt(0, g, 3, &x).ok());
  ASSERT_TRUE(
      EncodeWithPlan(plan, planned.codec(), &planned, 0, g, 3, &y).ok());
  EXPECT_EQ(x.SerializeAsString(), y.SerializeAsString());
}

// A valid two-segment tensor of 10 elements: 4 fp32, 6 onebit.
v1::EncodedTensor TwoSegments() {
  auto fp32 = MakeCodec(v1::CODEC_FP32, {});
  auto onebit = MakeCodec(v1::CODEC_ONEBIT, {});
  std::vector<float> v = Ramp(10, 0.1f);
  v1::EncodedTensor t;
  t.set_codec(v1::CODEC_SEGMENTS);
  t.set_num_elements(10);
  EXPECT_TRUE((*fp32)->Encode(absl::MakeSpan(v).subspan(0, 4), 1,
                              t.add_segments())
                  .ok());
  EXPECT_TRUE((*onebit)->Encode(absl::MakeSpan(v).subspan(4, 6), 1,
                                t.add_segments())
                  .ok());
  return t;
}

// A segments tensor adds each segment with its own codec's AddValid: the
// same bits as a copy and a DecodeAccumulate.
TEST(SegmentsDecoderTest, AddIntoIsCopyThenAccumulatePerSegment) {
  const v1::EncodedTensor t = TwoSegments();
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, 10);
  ASSERT_TRUE(v.ok()) << v.status();
  const std::vector<float> base = Ramp(10, -0.7f);
  std::vector<float> want = base;
  ASSERT_TRUE(DecoderFor(v1::CODEC_SEGMENTS)
                  ->DecodeAccumulate(t, 1.0f, absl::MakeSpan(want))
                  .ok());
  std::vector<float> out(10, 9.0f);
  v->AddInto(base, absl::MakeSpan(out));
  EXPECT_EQ(out, want);
  std::vector<float> in_place = base;
  v->AddInto(in_place, absl::MakeSpan(in_place));
  EXPECT_EQ(in_place, want);
}

std::string Refusal(const v1::EncodedTensor& t, uint64_t n = 10) {
  // Through the decoder's DecodeAccumulate too: the output is untouched.
  std::vector<float> acc(n, 3.0f);
  absl::Status d = DecoderFor(v1::CODEC_SEGMENTS)
                       ->DecodeAccumulate(t, 1.0f, absl::MakeSpan(acc));
  EXPECT_FALSE(d.ok());
  EXPECT_EQ(acc, std::vector<float>(n, 3.0f));
  absl::StatusOr<ValidatedTensor> v = ValidateTensor(t, n);
  EXPECT_FALSE(v.ok());
  if (v.ok()) return "";
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(v.status().message());
}

TEST(SegmentsDecoderTest, RefusesHostileTensorsNamingTheField) {
  const v1::EncodedTensor good = TwoSegments();
  ASSERT_TRUE(ValidateTensor(good, 10).ok());
  EXPECT_THAT(Refusal(TwoSegments(), 11), HasSubstr("num_elements is 10"));
  {
    v1::EncodedTensor t = TwoSegments();
    t.clear_segments();
    EXPECT_THAT(Refusal(t), HasSubstr("segments holds 0 tensors"));
  }
  {
    v1::EncodedTensor t = TwoSegments();
    *t.add_segments() = TwoSegments();  // nested
    EXPECT_THAT(Refusal(t), HasSubstr("segments[2].codec is segments"));
  }
  {
    v1::EncodedTensor t = TwoSegments();
    t.mutable_segments(1)->set_num_elements(7);  // 4 + 7 > 10
    EXPECT_THAT(Refusal(t), HasSubstr("segments[1].num_elements is 7"));
  }
  {
    v1::EncodedTensor t = TwoSegments();
    t.set_num_elements(12);  // segments cover only 10
    EXPECT_THAT(Refusal(t, 12), HasSubstr("segments cover 10 elements"));
  }
  {
    v1::EncodedTensor t = TwoSegments();
    t.mutable_segments(0)->set_num_elements(0);
    EXPECT_THAT(Refusal(t), HasSubstr("segments[0].num_elements is 0"));
  }
  {
    v1::EncodedTensor t = TwoSegments();
    t.set_payload("x");
    EXPECT_THAT(Refusal(t), HasSubstr("payload holds 1 bytes"));
  }
  {
    v1::EncodedTensor t = TwoSegments();
    t.mutable_params()->set_block_size(8);
    EXPECT_THAT(Refusal(t), HasSubstr("params is set"));
  }
  {
    // A bad segment: its own message, prefixed with where it is.
    v1::EncodedTensor t = TwoSegments();
    t.mutable_segments(1)->mutable_payload()->pop_back();
    EXPECT_THAT(Refusal(t), HasSubstr("segments[1]."));
  }
  {
    v1::EncodedTensor t = TwoSegments();
    t.mutable_segments(0)->set_codec(static_cast<v1::Codec>(42));
    EXPECT_THAT(Refusal(t), HasSubstr("segments[0].codec is 42"));
  }
  {
    // Only segments carry segments.
    v1::EncodedTensor t = TwoSegments().segments(0);
    *t.add_segments() = TwoSegments().segments(1);
    EXPECT_THAT(Refusal(t, 4), HasSubstr("segments holds 1 tensors for codec fp32"));
  }
  {
    // Many tiny segments: bounded.
    v1::EncodedTensor t;
    t.set_codec(v1::CODEC_SEGMENTS);
    t.set_num_elements(5000);
    auto fp32 = MakeCodec(v1::CODEC_FP32, {});
    const float one = 1.0f;
    for (int i = 0; i < 5000; ++i) {
      ASSERT_TRUE((*fp32)->Encode(absl::MakeConstSpan(&one, 1), 1,
                                  t.add_segments())
                      .ok());
    }
    EXPECT_THAT(Refusal(t, 5000), HasSubstr("expected 1..4096"));
  }
  // The segments decoder does not encode.
  std::vector<float> v(4, 1.0f);
  v1::EncodedTensor out;
  EXPECT_EQ(DecoderFor(v1::CODEC_SEGMENTS)->Encode(v, 1, &out).code(),
            absl::StatusCode::kFailedPrecondition);
  // And is no codec a user can name.
  EXPECT_FALSE(ParseCodecName("segments").ok());
}

}  // namespace
}  // namespace pserver
