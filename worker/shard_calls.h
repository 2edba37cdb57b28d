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
//   std::vector<absl::Status> st = (*calls)->Register(all, reqs, &resps);
//   // reqs[s] / resps[s] are shard s's; st[i] is shard all[i]'s.
//   st = (*calls)->PushChunks(all, chunks, prepare, finish);  // chunk calls
#ifndef PSERVER_WORKER_SHARD_CALLS_H_
#define PSERVER_WORKER_SHARD_CALLS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
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

  ~ShardCalls();

  size_t size() const { return stubs_.size(); }
  const std::string& address(size_t s) const { return options_.addresses[s]; }

  // For an owner going away with a call under way (a client destroyed
  // mid-step): from now on no call is retried, chunk calls in flight are
  // cancelled within ~0.1 s, and calls end with CANCELLED instead of
  // retrying unreachable shards for the retry budget. Thread-safe; cannot
  // be undone.
  void Abandon() { abandoned_.store(true); }

  // One call per shard in `shards`, all in flight at once; blocks until
  // each has an answer or gave up. reqs/resps are indexed by shard (size()
  // entries; only those in `shards` are used); the result by position in
  // `shards`.
  // retry_busy = false: a shard that answers REJECT_REASON_BUSY (another
  // worker is installing the model) is not retried here; its status says so.
  std::vector<absl::Status> Register(
      const std::vector<size_t>& shards,
      const std::vector<v1::RegisterRequest>& reqs,
      std::vector<v1::RegisterResponse>* resps, bool retry_busy = true);
  // One shard, one call.
  absl::Status Register(size_t s, const v1::RegisterRequest& req,
                        v1::RegisterResponse* resp);
  // GetStatus of every shard in `shards` (resps indexed by shard), retried
  // like Register.
  std::vector<absl::Status> Status(const std::vector<size_t>& shards,
                                   std::vector<v1::GetStatusResponse>* resps);
  // GetShardState / InstallShardState of every shard in `shards` (reqs and
  // resps indexed by shard), retried like Register.
  std::vector<absl::Status> GetShardState(
      const std::vector<size_t>& shards,
      const std::vector<v1::GetShardStateRequest>& reqs,
      std::vector<v1::GetShardStateResponse>* resps);
  std::vector<absl::Status> InstallShardState(
      const std::vector<size_t>& shards,
      const std::vector<v1::InstallShardStateRequest>& reqs,
      std::vector<v1::InstallShardStateResponse>* resps);
  // Leave on each shard in `shards` (worker/client_leave.cc).
  std::vector<absl::Status> Leave(const std::vector<size_t>& shards,
                                  const v1::LeaveRequest& req,
                                  std::vector<v1::LeaveResponse>* resps);

  // Chunked pushes and pulls (parameter_server.proto, "Chunks"): for every
  // shard s in `shards`, one call per chunk 0 .. chunks[s] - 1, at most
  // `window` in flight per shard and all shards at once. `prepare(s, c,
  // req)` fills chunk c's request on the calling thread just before it is
  // sent, in chunk order, so encoding chunk c + 1 overlaps chunk c on the
  // wire; `finish(s, c, resp)` runs on the calling thread as answers
  // arrive, so decoding overlaps the chunks still on the wire. An error from
  // either stops that shard's calls (the others go on). Retriable failures
  // are sent again, unchanged, within the retry budget. The request and
  // response objects are reused across calls (no per-step allocation).
  // Returns one status per entry of `shards`.
  // With `interrupted` (pushes and pulls of a step): when one shard's calls
  // fail, the calls of every shard not done yet stop as well (cancelled,
  // ABORTED, (*interrupted)[i] set), so the caller can recover the failed
  // shard before it waits on the others, then send theirs again. A shard
  // answers a push once it is summed, after the lower workers' pushes of
  // that chunk, and a pull once its round is complete: both can wait on a
  // worker that is itself waiting for this one to rejoin a restarted shard.
  using PreparePush =
      absl::FunctionRef<absl::Status(size_t s, uint32_t c, v1::PushRequest*)>;
  using FinishPush = absl::FunctionRef<absl::Status(
      size_t s, uint32_t c, const v1::PushResponse&)>;
  using PreparePull =
      absl::FunctionRef<absl::Status(size_t s, uint32_t c, v1::PullRequest*)>;
  using FinishPull = absl::FunctionRef<absl::Status(
      size_t s, uint32_t c, const v1::PullResponse&)>;
  // Which chunk of shard s to send next: one not sent yet whose input is
  // ready, or -1 when none is ready yet (asked again every kReadyPoll).
  // Empty: chunks 0, 1, 2, ... in order.
  using ChunkOrder = std::function<int64_t(size_t s)>;
  static constexpr absl::Duration kReadyPoll = absl::Microseconds(500);
  std::vector<absl::Status> PushChunks(const std::vector<size_t>& shards,
                                       const std::vector<uint32_t>& chunks,
                                       PreparePush prepare, FinishPush finish,
                                       const ChunkOrder& order = nullptr,
                                       std::vector<bool>* interrupted = nullptr);
  std::vector<absl::Status> PullChunks(const std::vector<size_t>& shards,
                                       const std::vector<uint32_t>& chunks,
                                       PreparePull prepare, FinishPull finish,
                                       std::vector<bool>* interrupted = nullptr);
  // The frozen variance, chunk by chunk.
  using PrepareVariance = absl::FunctionRef<absl::Status(
      size_t s, uint32_t c, v1::GetFrozenVarianceRequest*)>;
  using FinishVariance = absl::FunctionRef<absl::Status(
      size_t s, uint32_t c, const v1::GetFrozenVarianceResponse&)>;
  std::vector<absl::Status> FrozenVarianceChunks(
      const std::vector<size_t>& shards, const std::vector<uint32_t>& chunks,
      PrepareVariance prepare, FinishVariance finish);
  // A chunked Register's weight chunks (RegisterRequest.chunked_weights).
  using PrepareRegister = absl::FunctionRef<absl::Status(
      size_t s, uint32_t c, v1::RegisterRequest*)>;
  using FinishRegister = absl::FunctionRef<absl::Status(
      size_t s, uint32_t c, const v1::RegisterResponse&)>;
  std::vector<absl::Status> RegisterChunks(const std::vector<size_t>& shards,
                                           const std::vector<uint32_t>& chunks,
                                           PrepareRegister prepare,
                                           FinishRegister finish);
  // Chunk calls in flight per shard.
  static constexpr int kWindow = 4;

 private:
  class RetryNotes;
  using Done = std::function<void(grpc::Status)>;
  // Issues shard s's attempt on `ctx`; `done` runs when it finished.
  using Start =
      absl::FunctionRef<void(size_t s, grpc::ClientContext* ctx, Done done)>;

  ShardCalls(const ShardCallOptions& options, ClientMetrics* metrics);
  template <class Req, class Resp>
  struct Slots;
  template <class Req, class Resp, class Issue>
  std::vector<absl::Status> CallChunks(
      const char* method, absl::Duration attempt_timeout,
      const std::vector<size_t>& shards, const std::vector<uint32_t>& chunks,
      std::vector<std::unique_ptr<Slots<Req, Resp>>>* slots,
      absl::FunctionRef<absl::Status(size_t, uint32_t, Req*)> prepare,
      absl::FunctionRef<absl::Status(size_t, uint32_t, const Resp&)> finish,
      Issue issue, const ChunkOrder& order, std::vector<bool>* interrupted);
  // How often a chunk call waiting for answers looks at abandoned_.
  static constexpr absl::Duration kAbandonPoll = absl::Milliseconds(100);
  // CANCELLED for a call to shard s ended by Abandon().
  absl::Status Abandoned(const char* method, size_t s) const;
  // An error status for a failed call to shard s.
  absl::Status CallError(const char* method, size_t s,
                         const grpc::Status& status,
                         const grpc::ClientContext& ctx) const;
  std::vector<absl::Status> CallEach(const std::vector<size_t>& shards,
                                     absl::Duration attempt_timeout,
                                     const char* method, Start start,
                                     bool retry_busy = true);

  const ShardCallOptions options_;
  ClientMetrics* const metrics_;
  std::atomic<bool> abandoned_{false};
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  // Per shard: the chunk calls' reusable requests and responses.
  std::vector<std::unique_ptr<Slots<v1::PushRequest, v1::PushResponse>>>
      push_slots_;
  std::vector<std::unique_ptr<Slots<v1::PullRequest, v1::PullResponse>>>
      pull_slots_;
  std::vector<
      std::unique_ptr<Slots<v1::RegisterRequest, v1::RegisterResponse>>>
      register_slots_;
  std::vector<std::unique_ptr<
      Slots<v1::GetFrozenVarianceRequest, v1::GetFrozenVarianceResponse>>>
      variance_slots_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_SHARD_CALLS_H_
