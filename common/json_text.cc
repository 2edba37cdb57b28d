#include "common/json_text.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace pserver {

std::string JsonNumber(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.6g", v) : "null";
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", ch);
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

std::string CodecParamsJson(const v1::CodecParams& p) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(p, &out, options).ok()) {
    return "{}";
  }
  return out;
}

}  // namespace pserver
