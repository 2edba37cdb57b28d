#include "server/round_policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pserver {

const char* ConsistencyName(Consistency c) {
  switch (c) {
    case Consistency::kBsp:
      return "bsp";
    case Consistency::kSsp:
      return "ssp";
    case Consistency::kAsync:
      return "async";
  }
  return "unknown";
}

absl::StatusOr<Consistency> ParseConsistency(absl::string_view s) {
  if (s == "bsp") return Consistency::kBsp;
  if (s == "ssp") return Consistency::kSsp;
  if (s == "async") return Consistency::kAsync;
  return absl::InvalidArgumentError(absl::StrCat(
      "consistency is \"", s, "\"; expected bsp, ssp or async"));
}

absl::Status ValidateConsistencyConfig(const ConsistencyConfig& c) {
  if (c.mode != Consistency::kBsp && c.mode != Consistency::kSsp &&
      c.mode != Consistency::kAsync) {
    return absl::InvalidArgumentError(
        absl::StrCat("consistency is ", static_cast<int>(c.mode),
                     "; expected bsp, ssp or async"));
  }
  if (c.max_staleness > kMaxStaleness) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness is ", c.max_staleness, "; expected 0..",
                     kMaxStaleness));
  }
  if (c.mode != Consistency::kSsp && c.max_staleness != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_staleness is ", c.max_staleness, " with consistency ",
        ConsistencyName(c.mode),
        "; expected 0 (the bound applies to consistency ssp only)"));
  }
  if (!std::isfinite(c.patience) || c.patience < 0 || c.patience > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "patience is ", c.patience, "; expected 0..100"));
  }
  return absl::OkStatus();
}

std::string DescribeConsistency(const ConsistencyConfig& c) {
  std::string s = ConsistencyName(c.mode);
  if (c.mode == Consistency::kSsp) {
    absl::StrAppend(&s, "(s=", c.max_staleness, ")");
  }
  if (c.scale_by_staleness) absl::StrAppend(&s, ",scaled");
  return s;
}

}  // namespace pserver
