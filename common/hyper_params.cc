#include "common/hyper_params.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {

absl::Status ValidateHyperParams(
    const google::protobuf::RepeatedPtrField<v1::HyperParams>& hyper,
    int groups) {
  if (!hyper.empty() && hyper.size() != groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("hyper has ", hyper.size(), " entries; expected 0 or ",
                     groups, " (one per layout group)"));
  }
  for (int g = 0; g < hyper.size(); ++g) {
    for (auto [field, value] :
         {std::pair<const char*, float>{"lr", hyper[g].lr()},
          {"weight_decay", hyper[g].weight_decay()}}) {
      if (!std::isfinite(value) || value < 0.0f) {
        return absl::InvalidArgumentError(
            absl::StrCat("hyper[", g, "].", field, " is ", value,
                         "; expected a finite value >= 0"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pserver
