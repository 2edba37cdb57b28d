#include "common/rejection.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"

namespace pserver {
namespace {

constexpr char kPayloadUrl[] = "type.googleapis.com/pserver.v1.RejectReason";
constexpr char kPrefix[] = "REJECT_REASON_";

}  // namespace

absl::Status Reject(v1::RejectReason reason, absl::Status status) {
  status.SetPayload(kPayloadUrl, absl::Cord(ReasonName(reason)));
  return status;
}

v1::RejectReason ReasonOf(const absl::Status& status) {
  absl::optional<absl::Cord> p = status.GetPayload(kPayloadUrl);
  if (!p.has_value()) return v1::REJECT_REASON_UNSPECIFIED;
  return ParseReasonName(std::string(*p));
}

std::string ReasonName(v1::RejectReason reason) {
  return v1::RejectReason_Name(reason);
}

v1::RejectReason ParseReasonName(absl::string_view name) {
  v1::RejectReason r;
  if (!v1::RejectReason_Parse(std::string(name), &r)) {
    return v1::REJECT_REASON_UNSPECIFIED;
  }
  return r;
}

std::string ReasonLabel(v1::RejectReason reason) {
  std::string name = ReasonName(reason);
  if (name.empty()) return "unspecified";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(sizeof(kPrefix) - 1);
  return absl::AsciiStrToLower(name);
}

absl::Span<const v1::RejectReason> AllRejectReasons() {
  static const std::vector<v1::RejectReason>* all = [] {
    auto* v = new std::vector<v1::RejectReason>;
    const google::protobuf::EnumDescriptor* d = v1::RejectReason_descriptor();
    for (int i = 0; i < d->value_count(); ++i) {
      int n = d->value(i)->number();
      if (n != v1::REJECT_REASON_UNSPECIFIED) {
        v->push_back(static_cast<v1::RejectReason>(n));
      }
    }
    return v;
  }();
  return *all;
}

}  // namespace pserver
