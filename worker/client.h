// The client library: what a worker's training loop calls to train through
// pserver. It connects to every shard, registers the model, and per step
// pushes the worker's flat gradient and returns the next weights.
//
// Per step and shard it: takes the shard's slice of the gradient; in 1-bit
// Adam's compression stage multiplies it by the shard's frozen preconditioner
// D = 1 / (sqrt(v) + eps) (fetched once, when the stage changes); adds the
// error-feedback residual and encodes it with the push codec (warmup_codec
// while the optimizer is still in warmup); pushes all shards in parallel;
// then pulls all shards in parallel, applies each delta to the local replica
// and checks it against the shard's checksum, pulling a full snapshot on a
// mismatch. Pushes and pulls that fail with UNAVAILABLE or DEADLINE_EXCEEDED
// are retried with backoff: a repeated push is deduplicated by the shard.
//
// Usage:
//   ClientOptions o;
//   o.server_addresses = {"127.0.0.1:50051", "127.0.0.1:50052"};
//   o.worker_id = 0; o.num_workers = 4;
//   auto client = Client::Connect(o);                 // no RPC yet
//   (*client)->Register(layout, initial_weights);     // replica = weights
//   for (...) {
//     Compute(client->weights(), grad);
//     (*client)->Step(grad);                          // replica advanced
//   }
#ifndef PSERVER_WORKER_CLIENT_H_
#define PSERVER_WORKER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/layout.h"
#include "common/tls.h"
#include "pserver/v1/parameter_server.grpc.pb.h"

namespace pserver {

struct ClientOptions {
  // Shard i's address is server_addresses[i]; the count is the shard count.
  std::vector<std::string> server_addresses;
  uint32_t worker_id = 0;
  uint32_t num_workers = 1;
  // Codec of pushes once 1-bit Adam has frozen its variance, and at every
  // step for optimizers that never freeze (adam, sgd).
  v1::Codec push_codec = v1::CODEC_ONEBIT;
  v1::CodecParams push_params;
  // Codec of pushes during 1-bit Adam's warmup (fp32 or bf16 usually).
  v1::Codec warmup_codec = v1::CODEC_FP32;
  v1::CodecParams warmup_params;
  // Decay of the error-feedback residual (1 = exact error feedback).
  float ef_decay = 1.0f;
  // Base of the per-step encoder seeds (stochastic rounding, randomk).
  uint64_t seed = 1;
  // Deadline of one Register/Push/GetFrozenVariance attempt.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of one Pull attempt (it waits for the slowest worker).
  absl::Duration pull_timeout = absl::Seconds(120);
  // How long retriable failures (UNAVAILABLE, DEADLINE_EXCEEDED) are retried
  // before Step() gives up; backoff doubles from 50 ms up to 2 s.
  absl::Duration retry_budget = absl::Seconds(300);
  int max_message_bytes = 1 << 30;
  // TLS (on when security.ca_pem is set), the client certificate for mutual
  // TLS, and the token sent on every call (common/tls.h).
  TransportSecurity security;
};

// Bytes moved and time spent, since Connect().
struct ClientStats {
  uint64_t steps = 0;
  uint64_t push_payload_bytes = 0;  // encoded tensor payloads sent
  uint64_t pull_payload_bytes = 0;  // encoded tensor payloads received
  uint64_t push_fp32_bytes = 0;     // what fp32 would have sent
  uint64_t pull_fp32_bytes = 0;
  uint64_t snapshots = 0;           // pulls answered with a full snapshot
  uint64_t checksum_mismatches = 0;
  uint64_t retries = 0;
  uint64_t rejoins = 0;  // re-registrations after a shard restart or a drop
  double encode_seconds = 0;
  double push_seconds = 0;   // waiting on pushes (includes server rounds)
  double pull_seconds = 0;
};

// Thread-compatible: one training loop drives one Client.
class Client {
 public:
  // Creates channels to every shard. Does not contact them (gRPC connects
  // lazily). INVALID_ARGUMENT for an empty address list or bad ids.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);
  ~Client();

  // Registers this worker with every shard: the first worker's
  // `initial_weights` initialise the model; everyone then pulls a snapshot,
  // so on return weights() holds the shards' current replica and step() the
  // shards' current step. If a previous incarnation of this worker crashed
  // after pushing to only some shards, those are one step ahead: step() is
  // then the other shards' step, and the next Step()'s push to the ahead
  // shards is acknowledged as a duplicate (their slice of the replica is
  // already newer and resyncs by snapshot). Blocks on one Register and one
  // Pull per shard,
  // retrying while shards are unavailable (for up to retry_budget).
  // REQUIRES: initial_weights.size() == TotalElements(layout).
  // FAILED_PRECONDITION when the shards' layout or configuration differs.
  absl::Status Register(const v1::ModelLayout& layout,
                        absl::Span<const float> initial_weights);

  // Pushes `gradient` (the full flat gradient at weights()) for step(), then
  // waits for every shard's next weights and advances the replica. Blocks on
  // the slowest worker of the round. On return step() has advanced by one
  // and weights() holds the new replica. A non-finite gradient is refused
  // with INVALID_ARGUMENT before anything is sent (residuals unchanged).
  // REQUIRES: Register() succeeded; gradient.size() == num_params().
  absl::Status Step(absl::Span<const float> gradient);

  // The replica: the weights every worker holds for step().
  absl::Span<const float> weights() const { return replica_; }
  uint64_t step() const { return step_; }
  uint64_t num_params() const { return replica_.size(); }
  // COMPRESSION once every shard is in 1-bit Adam's compression stage.
  v1::OptimizerStage stage() const;
  const ClientStats& stats() const { return stats_; }
  // L2 norm of all shards' push error-feedback residuals together.
  double ResidualNorm() const;

  // Saves this worker's error-feedback residuals (every shard, both stages)
  // to `path` atomically, so a restarted worker loses none of the gradient
  // mass it has not sent yet. Format: worker/client_state.cc.
  absl::Status SaveState(const std::string& path) const;
  // Loads residuals saved by SaveState, after Register(). Refused (state
  // unchanged) when the file is corrupt or was written for another worker
  // id, worker count, shard layout or model size. Without it a restarted
  // worker starts with zero residuals, as DeepSpeed does on reload.
  absl::Status LoadState(const std::string& path);

 private:
  struct ShardState {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ParameterServer::Stub> stub;
    ShardRange range;
    std::unique_ptr<Codec> warmup_codec;
    std::unique_ptr<Codec> push_codec;
    std::unique_ptr<ErrorFeedback> warmup_ef;
    std::unique_ptr<ErrorFeedback> push_ef;
    std::vector<float> preconditioner;  // D, once frozen
    std::vector<float> scratch;         // D * g
    // The shard's optimizer stage as last seen (shards change stage at the
    // same step, except a shard that restarted without a checkpoint).
    v1::OptimizerStage stage = v1::OPTIMIZER_STAGE_WARMUP;
    // Checksum64 of this shard's replica slice, as the shard confirmed it
    // on the last pull (sent back with the next pull, not recomputed).
    uint64_t replica_checksum = 0;
  };

  explicit Client(const ClientOptions& options);
  absl::Status EncodeShard(size_t s, absl::Span<const float> g,
                           v1::PushRequest* req);
  // Pulls `step` from every shard; snapshot[s] asks shard s for a full
  // snapshot instead of a delta.
  // A shard that answers FAILED_PRECONDITION (it restarted behind `step`)
  // is handed to `recover` (register again, push again), then pulled anew.
  absl::Status PullAll(uint64_t step, std::vector<bool> snapshot,
                       bool registering,
                       const std::function<absl::Status(size_t)>& recover);
  // Registers again with shard s after it restarted or dropped this worker:
  // resume_step (0: none) lets a shard that lost rounds catch up, and the
  // replica's slice stands in for initial weights if it lost its model.
  // Returns the shard's step after registering.
  absl::StatusOr<uint64_t> Rejoin(size_t s, uint64_t resume_step);
  // Follows a change of shard s's stage: fetches the preconditioner when it
  // enters the compression stage; resets its residuals if it went back to
  // warmup (a shard that restarted from nothing).
  absl::Status SetStage(size_t s, v1::OptimizerStage stage);
  // DATA_LOSS when the replica does not match the shard's checksum; ABORTED,
  // with the replica untouched, when the shard answered another step (except
  // a snapshot one step ahead while `registering`).
  absl::Status ApplyPull(size_t s, uint64_t step, bool registering,
                         const v1::PullResponse& resp);
  absl::Status FetchPreconditioner(size_t s);
  bool compression_stage(size_t s) const {
    return shards_[s].stage == v1::OPTIMIZER_STAGE_COMPRESSION;
  }

  const ClientOptions options_;
  std::vector<ShardState> shards_;
  std::vector<float> replica_;
  uint64_t step_ = 0;
  bool registered_ = false;
  bool freezes_ = false;  // the server's optimizer has a compression stage
  v1::GradientSpace compression_space_ = v1::GRADIENT_SPACE_RAW;
  v1::ModelLayout layout_;
  ClientStats stats_;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_CLIENT_H_
