// Waiting until the shards hold a model, so that a worker other than rank 0
// registers only after rank 0's initial weights are installed and then
// starts from them (the shards take the first registration's weights).
#ifndef PSERVER_PYTHON_NATIVE_MODEL_WAIT_H_
#define PSERVER_PYTHON_NATIVE_MODEL_WAIT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace pserver::python {

// Asks every shard's GetStatus until each reports model_registered, every
// `poll` (unreachable shards are asked again), for at most `timeout`, over
// channels with `security` (common/tls.h), as the client's own.
// Blocks the calling thread; call it without the GIL.
// DEADLINE_EXCEEDED naming the shards still without a model after
// `timeout`; a shard's own refusal (not UNAVAILABLE) is returned as is.
absl::Status WaitForModel(const std::vector<std::string>& addresses,
                          const TransportSecurity& security,
                          absl::Duration timeout,
                          absl::Duration poll = absl::Milliseconds(50));

}  // namespace pserver::python

#endif  // PSERVER_PYTHON_NATIVE_MODEL_WAIT_H_
