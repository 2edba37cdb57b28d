#include "common/layout.h"

#include "gtest/gtest.h"

namespace pserver {
namespace {

v1::ModelLayout Mlp() {
  v1::ModelLayout l;
  auto add = [&](const char* name, std::initializer_list<uint64_t> shape) {
    v1::TensorSpec* t = l.add_tensors();
    t->set_name(name);
    for (uint64_t d : shape) t->add_shape(d);
  };
  add("fc1.w", {256, 784});
  add("fc1.b", {256});
  add("fc2.w", {128, 256});
  add("fc2.b", {128});
  return l;
}

TEST(Layout, ValidatesAndComputesOffsets) {
  auto slots = ValidateLayout(Mlp());
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_EQ(slots->size(), 4u);
  EXPECT_EQ((*slots)[1].offset, 256u * 784);
  EXPECT_EQ((*slots)[3].offset + (*slots)[3].size, TotalElements(Mlp()));
}

TEST(Layout, RejectsBadFieldsByName) {
  v1::ModelLayout l = Mlp();
  l.mutable_tensors(2)->set_shape(1, 0);
  auto s = ValidateLayout(l).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layout.tensors[2].shape[1]"), std::string::npos)
      << s;
  l = Mlp();
  l.mutable_tensors(3)->set_name("fc1.w");
  EXPECT_NE(ValidateLayout(l).status().message().find("repeated"),
            std::string::npos);
  EXPECT_FALSE(ValidateLayout(v1::ModelLayout()).ok());
}

TEST(Layout, ShardRangesTileAlignedAndBalanced) {
  for (uint64_t total : {0ull, 1ull, 255ull, 257ull, 235146ull, 1000000ull}) {
    for (uint32_t count : {1u, 2u, 3u, 7u}) {
      uint64_t expect_begin = 0;
      for (uint32_t i = 0; i < count; ++i) {
        ShardRange r = ShardRangeFor(total, count, i);
        EXPECT_EQ(r.begin, expect_begin);
        EXPECT_LE(r.begin, r.end);
        if (r.end != total) {
          EXPECT_EQ(r.end % kShardAlignment, 0u);
        }
        // Balanced to within one alignment block.
        EXPECT_LE(r.size(), (total + count - 1) / count + kShardAlignment);
        expect_begin = r.end;
      }
      EXPECT_EQ(expect_begin, total);
    }
  }
}

TEST(Layout, FirstDifferenceNamesField) {
  v1::ModelLayout a = Mlp(), b = Mlp();
  EXPECT_EQ(FirstLayoutDifference(a, b), "");
  a.mutable_tensors(2)->set_shape(0, 64);
  EXPECT_EQ(FirstLayoutDifference(a, b),
            "layout.tensors[2] ('fc2.w').shape[0] is 64, expected 128");
  a = Mlp();
  a.add_tensors()->set_name("extra");
  EXPECT_EQ(FirstLayoutDifference(a, b), "layout has 5 tensors, expected 4");
}

}  // namespace
}  // namespace pserver
