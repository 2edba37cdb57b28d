#include "server/round_hyper.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hyper_params.h"
#include "common/layout.h"
#include "common/rejection.h"

namespace pserver {
namespace {

std::string ValuesString(
    const google::protobuf::RepeatedPtrField<v1::HyperParams>& v) {
  if (v.empty()) return "none (the shard's own schedule)";
  std::string out = "[";
  for (int g = 0; g < v.size(); ++g) {
    absl::StrAppend(&out, g > 0 ? ", " : "", "{lr ", v[g].lr(),
                    ", weight_decay ", v[g].weight_decay(), "}");
  }
  return out + "]";
}

bool Same(const google::protobuf::RepeatedPtrField<v1::HyperParams>& a,
          const std::vector<v1::HyperParams>& b) {
  if (static_cast<size_t>(a.size()) != b.size()) return false;
  for (int g = 0; g < a.size(); ++g) {
    if (a[g].lr() != b[g].lr() || a[g].weight_decay() != b[g].weight_decay()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status RoundHyper::Validate(const v1::PushRequest& req, int groups) {
  absl::Status s = ValidateHyperParams(req.hyper(), groups);
  return s.ok() ? s : Reject(v1::REJECT_REASON_INVALID_FIELD, std::move(s));
}

absl::Status RoundHyper::Check(const v1::PushRequest& req, bool strict) const {
  if (!strict || !set_ || Same(req.hyper(), values_)) return absl::OkStatus();
  google::protobuf::RepeatedPtrField<v1::HyperParams> mine(values_.begin(),
                                                          values_.end());
  return Reject(
      v1::REJECT_REASON_HYPER_MISMATCH,
      absl::FailedPreconditionError(absl::StrCat(
          "hyper of worker ", req.worker_id(), " for step ", req.step(),
          " is ", ValuesString(req.hyper()), "; worker ", worker_,
          " pushed ", ValuesString(mine),
          " for the same round: every worker must send the same "
          "hyper-parameters (run the same learning-rate schedule)")));
}

void RoundHyper::Record(const v1::PushRequest& req) {
  if (set_ && req.step() < step_) return;
  set_ = true;
  step_ = req.step();
  worker_ = req.worker_id();
  values_.assign(req.hyper().begin(), req.hyper().end());
}

std::vector<GroupHyper> RoundHyper::For(uint64_t round,
                                        const OptimizerConfig& config,
                                        const v1::ModelLayout& layout) const {
  std::vector<GroupHyper> out;
  if (set_ && !values_.empty()) {
    for (const v1::HyperParams& h : values_) {
      out.push_back({h.lr(), h.weight_decay()});
    }
    return out;
  }
  const float lr = ScheduledLr(ScheduleOf(config), round);
  const int groups = GroupCount(layout);
  for (int g = 0; g < groups; ++g) {
    const v1::ParamGroup* p = g < layout.groups_size() ? &layout.groups(g)
                                                       : nullptr;
    const float scale = p != nullptr && p->has_lr_scale() ? p->lr_scale() : 1;
    const float wd = p != nullptr && p->has_weight_decay()
                         ? p->weight_decay()
                         : config.weight_decay;
    out.push_back({lr * scale, wd});
  }
  return out;
}

}  // namespace pserver
