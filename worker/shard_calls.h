// The client's RPCs to the shards: one channel per shard, calls to several
// shards in flight at once (gRPC's callback API), a deadline per attempt,
// and retries with backoff for what a retry can fix (UNAVAILABLE,
// DEADLINE_EXCEEDED) until the retry budget is spent. Everything else comes
// back at once as an absl::Status prefixed with the method, the shard and its
// address, carrying the shard's "pserver-reason" (common/rejection.h), so the
// caller decides on the reason (worker/recovery.h), not here.
//
// Usage:
//   auto calls = ShardCalls::Create(options, &metrics);
//   std::vector<absl::Status> st = (*calls)->Push(all, reqs, &resps);
//   // reqs[s] / resps[s] are shard s's; st[i] is shard all[i]'s.
#ifndef PSERVER_WORKER_SHARD_CALLS_H_
#define PSERVER_WORKER_SHARD_CALLS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "pserver/v1/parameter_server.grpc.pb.h"
#include "worker/client_metrics.h"

namespace pserver {

struct ShardCallOptions {
  // Shard i's address is addresses[i].
  std::vector<std::string> addresses;
  TransportSecurity security;
  int max_message_bytes = 1 << 30;
  // Deadline of one Register / Push / GetFrozenVariance attempt.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of one Pull attempt (a pull waits for the round's last push).
  absl::Duration pull_timeout = absl::Seconds(120);
  // Retriable failures are retried until this long after the call began;
  // backoff doubles from 50 ms up to 2 s.
  absl::Duration retry_budget = absl::Seconds(300);
};

// Thread-compatible: one thread issues calls (each call blocks until all its
// shards answered); the gRPC callbacks it waits on only fill per-call slots.
class ShardCalls {
 public:
  // Creates the channels; does not connect (gRPC connects lazily).
  // `metrics` counts retries and must outlive this object.
  static std::unique_ptr<ShardCalls> Create(const ShardCallOptions& options,
                                            ClientMetrics* metrics);

  size_t size() const { return stubs_.size(); }
  const std::string& address(size_t s) const { return options_.addresses[s]; }

  // One call per shard in `shards`, all in flight at once; blocks until
  // each has an answer or gave up. reqs/resps are indexed by shard (size()
  // entries; only those in `shards` are used); the result by position in
  // `shards`.
  std::vector<absl::Status> Register(
      const std::vector<size_t>& shards,
      const std::vector<v1::RegisterRequest>& reqs,
      std::vector<v1::RegisterResponse>* resps);
  std::vector<absl::Status> Push(const std::vector<size_t>& shards,
                                 const std::vector<v1::PushRequest>& reqs,
                                 std::vector<v1::PushResponse>* resps);
  std::vector<absl::Status> Pull(const std::vector<size_t>& shards,
                                 const std::vector<v1::PullRequest>& reqs,
                                 std::vector<v1::PullResponse>* resps);
  // One shard, one call.
  absl::Status Register(size_t s, const v1::RegisterRequest& req,
                        v1::RegisterResponse* resp);
  absl::Status Push(size_t s, const v1::PushRequest& req,
                    v1::PushResponse* resp);
  absl::Status GetFrozenVariance(size_t s,
                                 const v1::GetFrozenVarianceRequest& req,
                                 v1::GetFrozenVarianceResponse* resp);

 private:
  using Done = std::function<void(grpc::Status)>;
  // Issues shard s's attempt on `ctx`; `done` runs when it finished.
  using Start =
      absl::FunctionRef<void(size_t s, grpc::ClientContext* ctx, Done done)>;

  ShardCalls(const ShardCallOptions& options, ClientMetrics* metrics);
  std::vector<absl::Status> CallEach(const std::vector<size_t>& shards,
                                     absl::Duration attempt_timeout,
                                     const char* method, Start start);

  const ShardCallOptions options_;
  ClientMetrics* const metrics_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_SHARD_CALLS_H_
