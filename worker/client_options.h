// ClientOptions: how a worker's Client (worker/client.h) reaches the
// shards and encodes its pushes.
#ifndef PSERVER_WORKER_CLIENT_OPTIONS_H_
#define PSERVER_WORKER_CLIENT_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/schedule.h"
#include "common/tls.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {

struct ClientOptions {
  // Shard i's address is server_addresses[i]; the count is the shard count.
  std::vector<std::string> server_addresses;
  uint32_t worker_id = 0;
  uint32_t num_workers = 1;
  // Codec of pushes once 1-bit Adam has frozen its variance, and at every
  // step for optimizers that never freeze (adam, sgd). CODEC_UNSPECIFIED:
  // the job's, as the shards announce it at Register (onebit from shards
  // that announce none).
  v1::Codec push_codec = v1::CODEC_ONEBIT;
  v1::CodecParams push_params;
  // Codec of pushes during 1-bit Adam's warmup (fp32 or bf16 usually).
  v1::Codec warmup_codec = v1::CODEC_FP32;
  v1::CodecParams warmup_params;
  // The training script's Adam betas and eps, where it gave them (PyTorch's
  // betas / eps), sent at Register (RegisterRequest.adam_hyper): the job's
  // first registration sets them on shards whose flags left them out.
  std::optional<float> beta1, beta2, eps;
  // Local steps between pushes (worker/trainer.h), sent at Register so that
  // the shards refuse a worker whose schedule differs from the job's.
  uint32_t local_steps = 1;
  // Decay of the error-feedback residual (1 = exact error feedback).
  float ef_decay = 1.0f;
  // Momentum-factor masking of the workers' momentum under a sparse push
  // codec (PushCodecs::momentum_masking); Register refuses it unless the
  // shards run onebit_adam with --onebit_momentum=worker.
  bool momentum_masking = false;
  // A compression schedule (common/schedule.h; null: none), the same file
  // the shards have: the push codec follows the phase each shard announces
  // (RegisterResponse / PullResponse.schedule_phase), so every worker
  // switches at the same round; a phase without a push codec uses
  // push_codec / warmup_codec. The run's length for its fractions is given
  // with SetRunLength.
  std::shared_ptr<const CompressionSchedule> schedule;
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
  // Where the client reports what an operator should see while training
  // goes on: a shard that stops answering and is retried, the same shard
  // answering again, a rejoin. One line each, at most 10 per 10 s (the rest
  // counted, common/rate_limited_log.h). Empty: nowhere.
  std::function<void(absl::string_view)> log;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_CLIENT_OPTIONS_H_
