// The hyper-parameters of the round in progress: what the workers' pushes
// carry (PushRequest.hyper, e.g. from a PyTorch learning-rate scheduler) or,
// when they carry none, the shard's own learning-rate schedule scaled by
// each layout group's lr_scale, with each group's weight decay.
//
// Under bsp every push of a round must carry the same values: the first one
// sets them and any other is refused (REJECT_REASON_HYPER_MISMATCH) with
// both values and both workers named. Under ssp and async the workers of a
// round are at different steps by design, so the values pushed for the
// latest step win (a stale push does not turn the schedule back).
#ifndef PSERVER_SERVER_ROUND_HYPER_H_
#define PSERVER_SERVER_ROUND_HYPER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "pserver/v1/parameter_server.pb.h"
#include "server/optimizer.h"

namespace pserver {

// Thread-compatible: the shard calls it under its mutex.
class RoundHyper {
 public:
  // INVALID_ARGUMENT (REJECT_REASON_INVALID_FIELD) unless req.hyper is
  // empty or holds `groups` entries, each finite and >= 0.
  static absl::Status Validate(const v1::PushRequest& req, int groups);

  // Under bsp (`strict`): HYPER_MISMATCH (FAILED_PRECONDITION) when the
  // round's values are set and req's differ; nothing is recorded then.
  absl::Status Check(const v1::PushRequest& req, bool strict) const;
  // Records req's values for the round (a push that passed Check), unless
  // values for a later step are recorded already.
  void Record(const v1::PushRequest& req);
  // A new round: nothing pushed yet.
  void Clear() { set_ = false; }

  // The values round `round` steps with: the pushed ones, or the shard's
  // schedule for `layout`'s groups.
  std::vector<GroupHyper> For(uint64_t round, const OptimizerConfig& config,
                              const v1::ModelLayout& layout) const;

 private:
  bool set_ = false;
  uint32_t worker_ = 0;
  uint64_t step_ = 0;  // the step the recorded values were pushed for
  std::vector<v1::HyperParams> values_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_ROUND_HYPER_H_
