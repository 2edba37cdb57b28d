// ShardCalls: the shard-state transfer calls (GetShardState,
// InstallShardState), one chunk per shard per call, and Leave; the client's
// side of server/shard_transfer.cc is worker/client_transfer.cc.
#include "worker/shard_calls.h"

namespace pserver {

std::vector<absl::Status> ShardCalls::GetShardState(
    const std::vector<size_t>& shards,
    const std::vector<v1::GetShardStateRequest>& reqs,
    std::vector<v1::GetShardStateResponse>* resps) {
  resps->resize(stubs_.size());
  return CallEach(shards, options_.rpc_timeout, "GetShardState",
                  [&](size_t s, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->GetShardState(
                        ctx, &reqs[s], &(*resps)[s], std::move(done));
                  });
}

std::vector<absl::Status> ShardCalls::InstallShardState(
    const std::vector<size_t>& shards,
    const std::vector<v1::InstallShardStateRequest>& reqs,
    std::vector<v1::InstallShardStateResponse>* resps) {
  resps->resize(stubs_.size());
  return CallEach(shards, options_.rpc_timeout, "InstallShardState",
                  [&](size_t s, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->InstallShardState(
                        ctx, &reqs[s], &(*resps)[s], std::move(done));
                  });
}

std::vector<absl::Status> ShardCalls::Leave(
    const std::vector<size_t>& shards, const v1::LeaveRequest& req,
    std::vector<v1::LeaveResponse>* resps) {
  resps->resize(stubs_.size());
  return CallEach(shards, options_.rpc_timeout, "Leave",
                  [&](size_t s, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->Leave(ctx, &req, &(*resps)[s],
                                              std::move(done));
                  });
}

}  // namespace pserver
