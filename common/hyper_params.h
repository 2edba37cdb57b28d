// Checks of the per-group hyper-parameters a push carries
// (v1::PushRequest.hyper), shared by the worker that sends them
// (worker/client.h SetHyper) and the shard that takes them
// (server/round_hyper.h).
#ifndef PSERVER_COMMON_HYPER_PARAMS_H_
#define PSERVER_COMMON_HYPER_PARAMS_H_

#include "absl/status/status.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

// INVALID_ARGUMENT naming the entry unless `hyper` is empty or holds
// `groups` entries, each lr and weight_decay finite and >= 0.
absl::Status ValidateHyperParams(
    const google::protobuf::RepeatedPtrField<v1::HyperParams>& hyper,
    int groups);

}  // namespace pserver

#endif  // PSERVER_COMMON_HYPER_PARAMS_H_
