#include "python/native/model_wait.h"

#include <algorithm>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/tls.h"
#include "pserver/v1/parameter_server.grpc.pb.h"

namespace pserver::python {

absl::Status WaitForModel(const std::vector<std::string>& addresses,
                          const TransportSecurity& security,
                          absl::Duration timeout, absl::Duration poll) {
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs;
  for (const std::string& a : addresses) {
    stubs.push_back(v1::ParameterServer::NewStub(
        grpc::CreateChannel(a, MakeChannelCredentials(security))));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<bool> ready(addresses.size(), false);
  while (true) {
    std::vector<std::string> waiting;
    for (size_t s = 0; s < stubs.size(); ++s) {
      if (ready[s]) continue;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(
          std::min(deadline, absl::Now() + absl::Seconds(5))));
      v1::GetStatusRequest req;
      v1::GetStatusResponse resp;
      grpc::Status st = stubs[s]->GetStatus(&ctx, req, &resp);
      if (st.ok()) {
        ready[s] = resp.model_registered();
      } else if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
                 st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                            absl::StrCat("shard ", s, " (", addresses[s],
                                         ") GetStatus: ", st.error_message()));
      }
      if (!ready[s]) waiting.push_back(addresses[s]);
    }
    if (waiting.empty()) return absl::OkStatus();
    if (absl::Now() + poll > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no model registered after ", absl::FormatDuration(timeout),
          " on ", absl::StrJoin(waiting, ", "),
          "; expected rank 0 to register first"));
    }
    absl::SleepFor(poll);
  }
}

}  // namespace pserver::python
