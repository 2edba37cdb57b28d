// ShardConfig: what one shard is told at start (pserver_server's flags),
// its check, and the job-wide choices derived from it that a Register
// announces (the push codec). Its limits are constants here too.
#ifndef PSERVER_SERVER_SHARD_CONFIG_H_
#define PSERVER_SERVER_SHARD_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/chunking.h"
#include "common/schedule.h"
#include "pserver/v1/codec.pb.h"
#include "server/optimizer.h"
#include "server/round_policy.h"

namespace pserver {

// The largest model a shard accepts by default: the layout's own cap.
inline constexpr uint64_t kDefaultMaxModelElements = uint64_t{1} << 29;
// Bytes a PullResponse needs beyond its weights' payload (fields, tags).
inline constexpr uint64_t kPullResponseOverheadBytes = 4096;
// resume_step must be below this (2^62; this value itself is refused): far
// beyond any run, and small enough that no step arithmetic can wrap.
inline constexpr uint64_t kMaxResumeStep = uint64_t{1} << 62;
// A chunked installation whose installer made no call for this long may be
// taken over by another worker's Register.
inline constexpr absl::Duration kInstallTimeout = absl::Seconds(30);

struct ShardConfig {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t num_workers = 1;
  // Workers 0 .. initial_workers - 1 are the job at the start; the other
  // slots, up to num_workers, are for workers that join it later (0: every
  // slot is a worker from the start).
  uint32_t initial_workers = 0;
  OptimizerConfig optimizer;
  // The codec of pull deltas. CODEC_FP32 means every pull is an exact fp32
  // snapshot of x (as many bytes as an fp32 delta, and no rounding).
  v1::Codec pull_codec = v1::CODEC_ONEBIT;
  v1::CodecParams pull_params;
  // The job's push codec, announced at Register: a worker that chose none
  // pushes with it. Unspecified: the optimizer's default (onebit for
  // onebit_adam, fp32 for adam and sgd). Given (pserver_server
  // --push_codec): a worker that chose another is refused.
  v1::Codec push_codec = v1::CODEC_UNSPECIFIED;
  // Whether optimizer.beta1 / beta2 / eps were given (pserver_server
  // flags): false lets the installing Register set them (its
  // RegisterRequest.adam_hyper), as it sets the layout.
  bool beta1_given = true, beta2_given = true, eps_given = true;
  // Where checkpoints go (empty: none). The newest usable one is loaded at
  // start. One folder per shard.
  std::string checkpoint_dir;
  // Write a checkpoint every this many rounds (0: only on Close()).
  uint64_t checkpoint_every = 0;
  // A worker that makes no call for this long while the round waits for it
  // is dropped from the rounds, so the others go on (0: never). Waiting in
  // a Pull, or having pushed the current round, counts as alive.
  absl::Duration lease_timeout = absl::ZeroDuration();
  // The largest model (all shards) a Register may install; checked before
  // anything is allocated.
  uint64_t max_model_elements = kDefaultMaxModelElements;
  // The largest response the transport will send (0: no limit). A model
  // whose slice's fp32 snapshot would not fit is refused at Register, so
  // the limits can never disagree at run time.
  uint64_t max_response_bytes = 0;
  // Pushes and pulls move the slice in chunks of this many elements
  // (announced in RegisterResponse; common/chunking.h bounds it).
  uint64_t chunk_elements = kDefaultChunkElements;
  // The workers' local steps between pushes that this shard accepts
  // (RegisterRequest.local_steps, 0 counting as 1): a Register with
  // another value is refused FAILED_PRECONDITION, CONFIG_MISMATCH, before
  // anything changes. 0: any; the installer's value holds for the job.
  uint32_t local_steps = 0;
  // The compression schedule (common/schedule.h; null: none): per phase of
  // the run, the pull codec (overriding pull_codec) and the workers' push
  // codec. The shard resolves it against the run length of the Register
  // that installs the model, announces each round's phase and refuses
  // workers with another schedule.
  std::shared_ptr<const CompressionSchedule> schedule;
  // What a round waits for and which stale pushes it takes
  // (server/round_policy.h; bsp by default).
  ConsistencyConfig consistency;
};

absl::Status ValidateShardConfig(const ShardConfig& c);
// The job's push codec (ShardConfig::push_codec or the optimizer's
// default) and where it comes from, as RegisterResponse announces them.
v1::Codec JobPushCodec(const ShardConfig& c);
std::string JobPushCodecSource(const ShardConfig& c);

}  // namespace pserver

#endif  // PSERVER_SERVER_SHARD_CONFIG_H_
