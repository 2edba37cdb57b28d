#include "worker/shard_calls.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/rejection.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace pserver {
namespace {

bool Retriable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

std::unique_ptr<ShardCalls> ShardCalls::Create(const ShardCallOptions& options,
                                               ClientMetrics* metrics) {
  return std::unique_ptr<ShardCalls>(new ShardCalls(options, metrics));
}

ShardCalls::ShardCalls(const ShardCallOptions& options, ClientMetrics* metrics)
    : options_(options), metrics_(metrics) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  for (const std::string& address : options.addresses) {
    stubs_.push_back(v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
        address, MakeChannelCredentials(options.security), args)));
  }
}

std::vector<absl::Status> ShardCalls::CallEach(
    const std::vector<size_t>& shards, absl::Duration attempt_timeout,
    const char* method, Start start) {
  std::vector<absl::Status> out(shards.size());
  std::vector<size_t> pending(shards.size());  // indexes into shards
  for (size_t i = 0; i < shards.size(); ++i) pending[i] = i;
  const absl::Time give_up = absl::Now() + options_.retry_budget;
  absl::Duration backoff = absl::Milliseconds(50);
  while (!pending.empty()) {
    std::vector<grpc::Status> result(pending.size());
    std::vector<std::unique_ptr<grpc::ClientContext>> ctx(pending.size());
    absl::BlockingCounter left(static_cast<int>(pending.size()));
    for (size_t i = 0; i < pending.size(); ++i) {
      ctx[i] = std::make_unique<grpc::ClientContext>();
      ctx[i]->set_deadline(absl::ToChronoTime(absl::Now() + attempt_timeout));
      // Wait for a shard that is (re)starting instead of failing at once.
      ctx[i]->set_wait_for_ready(true);
      start(shards[pending[i]], ctx[i].get(),
            [&result, &left, i](grpc::Status s) {
              result[i] = std::move(s);
              left.DecrementCount();
            });
    }
    left.Wait();
    std::vector<size_t> again;
    for (size_t i = 0; i < pending.size(); ++i) {
      const size_t shard = shards[pending[i]];
      if (result[i].ok()) {
        out[pending[i]] = absl::OkStatus();
      } else if (Retriable(result[i]) && absl::Now() < give_up) {
        again.push_back(pending[i]);
      } else {
        absl::Status st = FromGrpcStatus(result[i], *ctx[i]);
        absl::Status prefixed(
            st.code(), absl::StrCat(method, " to shard ", shard, " (",
                                    address(shard), "): ", st.message()));
        const v1::RejectReason reason = ReasonOf(st);
        out[pending[i]] = reason == v1::REJECT_REASON_UNSPECIFIED
                              ? std::move(prefixed)
                              : Reject(reason, std::move(prefixed));
      }
    }
    if (again.empty()) break;
    metrics_->CountRetries(again.size());
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
    pending = std::move(again);
  }
  return out;
}

std::vector<absl::Status> ShardCalls::Register(
    const std::vector<size_t>& shards,
    const std::vector<v1::RegisterRequest>& reqs,
    std::vector<v1::RegisterResponse>* resps) {
  return CallEach(shards, options_.rpc_timeout, "Register",
                  [&](size_t s, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->Register(ctx, &reqs[s], &(*resps)[s],
                                                 std::move(done));
                  });
}

std::vector<absl::Status> ShardCalls::Push(
    const std::vector<size_t>& shards, const std::vector<v1::PushRequest>& reqs,
    std::vector<v1::PushResponse>* resps) {
  return CallEach(shards, options_.rpc_timeout, "Push",
                  [&](size_t s, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->Push(ctx, &reqs[s], &(*resps)[s],
                                             std::move(done));
                  });
}

std::vector<absl::Status> ShardCalls::Pull(
    const std::vector<size_t>& shards, const std::vector<v1::PullRequest>& reqs,
    std::vector<v1::PullResponse>* resps) {
  return CallEach(shards, options_.pull_timeout, "Pull",
                  [&](size_t s, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->Pull(ctx, &reqs[s], &(*resps)[s],
                                             std::move(done));
                  });
}

absl::Status ShardCalls::Register(size_t s, const v1::RegisterRequest& req,
                                  v1::RegisterResponse* resp) {
  return CallEach({s}, options_.rpc_timeout, "Register",
                  [&](size_t, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->Register(ctx, &req, resp,
                                                 std::move(done));
                  })[0];
}

absl::Status ShardCalls::Push(size_t s, const v1::PushRequest& req,
                              v1::PushResponse* resp) {
  return CallEach({s}, options_.rpc_timeout, "Push",
                  [&](size_t, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->Push(ctx, &req, resp, std::move(done));
                  })[0];
}

absl::Status ShardCalls::GetFrozenVariance(
    size_t s, const v1::GetFrozenVarianceRequest& req,
    v1::GetFrozenVarianceResponse* resp) {
  return CallEach({s}, options_.rpc_timeout, "GetFrozenVariance",
                  [&](size_t, grpc::ClientContext* ctx, Done done) {
                    stubs_[s]->async()->GetFrozenVariance(ctx, &req, resp,
                                                          std::move(done));
                  })[0];
}

}  // namespace pserver
