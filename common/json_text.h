// Pieces of JSON written by hand (the codec profiler's and the tuner's
// reports): numbers, strings and codec parameters.
#ifndef PSERVER_COMMON_JSON_TEXT_H_
#define PSERVER_COMMON_JSON_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

// A JSON number ("%.6g"); null for what JSON cannot hold (inf, NaN).
std::string JsonNumber(double v);
// A quoted JSON string: '"' and '\' escaped, control characters as \uXXXX.
std::string JsonString(absl::string_view s);
// The parameters as a JSON object with the proto's field names; "{}" when
// they cannot be printed.
std::string CodecParamsJson(const v1::CodecParams& p);

}  // namespace pserver

#endif  // PSERVER_COMMON_JSON_TEXT_H_
