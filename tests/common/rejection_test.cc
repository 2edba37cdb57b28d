// Reasons next to codes (issue 9, "Reasons, not just codes"): a reason rides
// on an absl::Status, survives the conversion to a gRPC status plus trailer
// and back, and has a fixed metric label.
#include "common/rejection.h"

#include "gtest/gtest.h"

namespace pserver {
namespace {

TEST(Rejection, ReasonRidesOnTheStatus) {
  absl::Status s = Reject(v1::REJECT_REASON_FUTURE_STEP,
                          absl::FailedPreconditionError("step is 7"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "step is 7");
  EXPECT_EQ(ReasonOf(s), v1::REJECT_REASON_FUTURE_STEP);
  EXPECT_EQ(ReasonOf(absl::FailedPreconditionError("x")),
            v1::REJECT_REASON_UNSPECIFIED);
  EXPECT_EQ(ReasonOf(absl::OkStatus()), v1::REJECT_REASON_UNSPECIFIED);
}

TEST(Rejection, LabelsAreTheEnumNamesInLowerCase) {
  EXPECT_EQ(ReasonLabel(v1::REJECT_REASON_WRONG_SPACE), "wrong_space");
  EXPECT_EQ(ReasonLabel(v1::REJECT_REASON_PULL_BEFORE_PUSH), "pull_before_push");
  EXPECT_EQ(ReasonLabel(v1::REJECT_REASON_UNSPECIFIED), "unspecified");
}

TEST(Rejection, NamesParseBackAndUnknownNamesAreUnspecified) {
  for (v1::RejectReason r : AllRejectReasons()) {
    EXPECT_EQ(ParseReasonName(ReasonName(r)), r);
  }
  EXPECT_EQ(ParseReasonName("REJECT_REASON_FROM_THE_FUTURE"),
            v1::REJECT_REASON_UNSPECIFIED);
  EXPECT_EQ(ParseReasonName(""), v1::REJECT_REASON_UNSPECIFIED);
}

TEST(Rejection, AllReasonsAreDistinctAndExcludeUnspecified) {
  absl::Span<const v1::RejectReason> all = AllRejectReasons();
  EXPECT_GE(all.size(), 18u);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_NE(all[i], v1::REJECT_REASON_UNSPECIFIED);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(all[i], all[j]);
  }
}

}  // namespace
}  // namespace pserver
