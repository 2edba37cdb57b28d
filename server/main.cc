// pserver_server: one shard of the parameter server.
//
//   pserver_server --shard_index=0 --num_shards=2 --num_workers=4
//                  --listen=0.0.0.0:50051 --metrics_listen=0.0.0.0:9100
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/schedule.h"
#include "common/daemon/command_line.h"
#include "common/daemon/daemon_flags.h"
#include "common/file_io.h"
#include "common/process_stats.h"
#include "prometheus/registry.h"
#include "server/shard_server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051",
          "gRPC listen address, host:port (port 0 picks a free one)");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9100",
          "Prometheus /metrics listen address, host:port; empty disables");
ABSL_FLAG(uint32_t, shard_index, 0, "this shard, 0 .. num_shards-1");
ABSL_FLAG(uint32_t, num_shards, 1, "shards the model is split into");
ABSL_FLAG(uint32_t, num_workers, 1,
          "workers whose pushes make up a round (BSP); with --initial_workers, "
          "the most workers the job may have");
ABSL_FLAG(uint32_t, initial_workers, 0,
          "workers 0 .. N-1 start the job; workers N .. num_workers-1 may "
          "join it while it runs (0: all num_workers start it)");
ABSL_FLAG(std::string, optimizer, "onebit_adam", "onebit_adam, adam or sgd");
ABSL_FLAG(float, lr, 1e-3f,
          "learning rate: the peak of the schedule (--lr_warmup_rounds, "
          "--lr_decay); pushes that carry their own (PyTorch schedulers) "
          "override it for their round");
ABSL_FLAG(uint64_t, lr_warmup_rounds, 0,
          "linear learning-rate warmup: round t < W steps with "
          "lr * (t + 1) / W (0: none)");
ABSL_FLAG(std::string, lr_decay, "constant",
          "after the warmup: constant, linear or cosine decay from --lr to "
          "--min_lr over --lr_decay_rounds rounds, then --min_lr");
ABSL_FLAG(uint64_t, lr_decay_rounds, 0,
          "rounds of the --lr_decay after the warmup (>= 1 for linear and "
          "cosine)");
ABSL_FLAG(float, min_lr, 0.0f,
          "where the --lr_decay ends (0 .. --lr)");
ABSL_FLAG(std::optional<float>, beta1, std::nullopt,
          "Adam beta1 (momentum decay); unset: the first worker's "
          "optimizer's (PyTorch's betas[0]), else 0.9");
ABSL_FLAG(float, compression_beta1, -1.0f,
          "onebit_adam: the momentum's decay after the freeze (the workers' "
          "with --onebit_momentum=worker); -1: --beta1");
ABSL_FLAG(std::optional<float>, beta2, std::nullopt,
          "Adam beta2 (variance decay); unset: the first worker's "
          "optimizer's (PyTorch's betas[1]), else 0.999");
ABSL_FLAG(std::optional<float>, eps, std::nullopt,
          "Adam eps, added outside the sqrt; unset: the first worker's "
          "optimizer's, else 1e-8");
ABSL_FLAG(float, weight_decay, 0.0f,
          "decoupled weight decay for Adam variants (AdamW), L2 for sgd");
ABSL_FLAG(std::optional<bool>, bias_correction, std::nullopt,
          "apply Adam's bias correction (onebit_adam: in warmup, and the "
          "frozen moments are bias-corrected); unset: on for adam (as "
          "torch.optim.Adam), off for onebit_adam (DeepSpeed's 1-bit Adam, "
          "the recipe pserver's results are measured with)");
ABSL_FLAG(float, momentum, 0.9f, "sgd momentum");
ABSL_FLAG(bool, nesterov, false,
          "sgd: Nesterov momentum (with workers' --local_steps > 1: DiLoCo's "
          "outer optimizer, e.g. --lr=0.7 --momentum=0.9)");
ABSL_FLAG(uint64_t, freeze_step, 100,
          "onebit_adam: rounds of plain Adam before v is frozen");
ABSL_FLAG(float, variance_floor, 0.1f,
          "onebit_adam robust mode: at the freeze sqrt(v) is floored at this "
          "fraction of its per-tensor mean");
ABSL_FLAG(bool, variance_growth, false,
          "onebit_adam compression stage: scale the step at round t by "
          "sqrt((1 - beta2^T) / (1 - beta2^t)), T the freeze round: the "
          "growth Adam's uncorrected v would still have (no effect with "
          "--bias_correction)");
ABSL_FLAG(std::string, onebit_mode, "robust",
          "onebit_adam: 'robust' (variance floor, preconditioned pushes) or "
          "'deepspeed' (no floor, raw-gradient pushes)");
ABSL_FLAG(std::string, onebit_momentum, "server",
          "onebit_adam compression stage: 'server' (workers push gradients, "
          "the shard keeps the momentum) or 'worker' (workers keep the "
          "momentum and push it: DeepSpeed's 1-bit Adam, DGC's momentum "
          "correction)");
ABSL_FLAG(std::string, push_codec, "",
          "the job's push codec, announced to workers at Register: a worker "
          "that names none pushes with it, one that names another is "
          "refused (empty: onebit with --optimizer=onebit_adam, fp32 with "
          "adam and sgd; a worker may then name another)");
ABSL_FLAG(std::string, pull_codec, "onebit",
          "codec of pull deltas: fp32 (exact snapshots), fp16, bf16, onebit, "
          "topk, randomk, quantize, topk_quantize, block_topk");
ABSL_FLAG(uint32_t, pull_block_size, 256,
          "pull codec: elements per scale block (onebit, quantize), or per "
          "block for block_topk (4..64: set it, e.g. 16)");
ABSL_FLAG(double, pull_k_fraction, 0.01,
          "pull codec: fraction kept by topk/randomk");
ABSL_FLAG(std::string, schedule, "",
          "compression schedule file (JSON or text proto; docs/schedules.md): "
          "per phase of the run, the pull codec and the workers' push codec; "
          "the workers need the same file");
ABSL_FLAG(uint32_t, pull_bits, 8, "pull codec: bits for quantize, 2..8");
ABSL_FLAG(std::string, consistency, "bsp",
          "what rounds wait for (docs/consistency.md): bsp (every live "
          "worker), ssp (bounded staleness, see --max_staleness) or async "
          "(nobody)");
ABSL_FLAG(uint32_t, max_staleness, 0,
          "with --consistency=ssp: the most rounds a push may land after the "
          "step it was computed on (0 behaves as bsp)");
ABSL_FLAG(std::string, staleness_scaling, "none",
          "with ssp or async: none, or inverse (a push s rounds stale counts "
          "1/s in its round's mean)");
ABSL_FLAG(double, ssp_patience, 1.0,
          "with ssp: how long past the median arrival of the workers that "
          "kept up a round waits for the rest of them, as a fraction of that "
          "median");
ABSL_FLAG(int32_t, max_message_mb, 1024,
          "largest gRPC message in MiB, each direction (1..2047)");
ABSL_FLAG(uint32_t, grpc_memory_mb, 2048,
          "what gRPC may buffer for all calls together, in MiB (0: no "
          "quota; else at least --max_message_mb); calls past it are "
          "refused RESOURCE_EXHAUSTED");
ABSL_FLAG(uint64_t, chunk_elements, pserver::kDefaultChunkElements,
          "pushes and pulls move the shard's slice in chunks of this many "
          "elements, several in flight per worker (1024..67108864)");
ABSL_FLAG(uint32_t, local_steps, 0,
          "the workers' local steps between pushes this shard accepts "
          "(DiLoCo's H, the workers' local_steps); a worker with another "
          "value is refused at Register. 0: any (the first registration "
          "sets the job's)");
ABSL_FLAG(uint64_t, max_model_elements, pserver::kDefaultMaxModelElements,
          "largest model, in elements over all shards, that a Register may "
          "install (1 up to the default, the layout format's own cap); a "
          "larger layout is refused RESOURCE_EXHAUSTED before anything is "
          "allocated");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "folder for this shard's checkpoints (empty: none); the newest "
          "usable one is loaded at start, a final one written on SIGTERM");
ABSL_FLAG(uint64_t, checkpoint_every, 100,
          "with --checkpoint_dir: write a checkpoint every N rounds (0: only "
          "on SIGTERM/SIGINT)");
ABSL_FLAG(double, lease_timeout_seconds, 30,
          "drop a worker from the rounds after this many seconds without a "
          "call from it, so the others go on (0: wait forever)");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the bound gRPC port here once listening (for "
          "scripts that use --listen with port 0)");
ABSL_FLAG(int32_t, drain_seconds, 10,
          "on SIGTERM/SIGINT, time in-flight calls get to finish");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain; with --tls_key serves TLS only (empty: "
          "plaintext)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle; if set, clients must present a certificate that "
          "chains to it (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the shared token every call must carry as "
          "'authorization: Bearer <token>' (needs TLS; empty: the "
          "PSERVER_AUTH_TOKEN environment variable, if set)");

namespace pserver {
namespace {

int Fail(absl::string_view message) {
  std::fprintf(stderr, "pserver_server: %s\n", std::string(message).c_str());
  return 2;
}

absl::StatusOr<OptimizerKind> OptimizerFromFlag() {
  std::vector<FlagChoice<OptimizerKind>> choices;
  for (OptimizerKind k : {OptimizerKind::kOneBitAdam, OptimizerKind::kAdam,
                          OptimizerKind::kSgd}) {
    choices.push_back({OptimizerName(k), k});
  }
  return ParseEnumFlag("optimizer", absl::GetFlag(FLAGS_optimizer), choices);
}

int Run() {
  ShardConfig config;
  config.shard_index = absl::GetFlag(FLAGS_shard_index);
  config.num_shards = absl::GetFlag(FLAGS_num_shards);
  config.num_workers = absl::GetFlag(FLAGS_num_workers);
  config.initial_workers = absl::GetFlag(FLAGS_initial_workers);
  absl::StatusOr<OptimizerKind> kind = OptimizerFromFlag();
  if (!kind.ok()) return Fail(kind.status().message());
  OptimizerConfig& o = config.optimizer;
  o.kind = *kind;
  o.lr = absl::GetFlag(FLAGS_lr);
  // Left out, they are the first worker's optimizer's (its Register).
  config.beta1_given = absl::GetFlag(FLAGS_beta1).has_value();
  config.beta2_given = absl::GetFlag(FLAGS_beta2).has_value();
  config.eps_given = absl::GetFlag(FLAGS_eps).has_value();
  o.beta1 = absl::GetFlag(FLAGS_beta1).value_or(o.beta1);
  o.beta2 = absl::GetFlag(FLAGS_beta2).value_or(o.beta2);
  o.compression_beta1 = absl::GetFlag(FLAGS_compression_beta1);
  o.eps = absl::GetFlag(FLAGS_eps).value_or(o.eps);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.bias_correction = absl::GetFlag(FLAGS_bias_correction)
                          .value_or(o.kind == OptimizerKind::kAdam);
  o.lr_warmup_rounds = absl::GetFlag(FLAGS_lr_warmup_rounds);
  absl::StatusOr<LrDecay> decay = ParseLrDecay(absl::GetFlag(FLAGS_lr_decay));
  if (!decay.ok()) return Fail(absl::StrCat("--", decay.status().message()));
  o.lr_decay = *decay;
  o.lr_decay_rounds = absl::GetFlag(FLAGS_lr_decay_rounds);
  o.min_lr = absl::GetFlag(FLAGS_min_lr);
  o.momentum = absl::GetFlag(FLAGS_momentum);
  o.nesterov = absl::GetFlag(FLAGS_nesterov);
  o.freeze_step = absl::GetFlag(FLAGS_freeze_step);
  o.variance_floor = absl::GetFlag(FLAGS_variance_floor);
  o.variance_growth = absl::GetFlag(FLAGS_variance_growth);
  // robust: preconditioned pushes, floored variance; deepspeed: neither.
  absl::StatusOr<bool> robust =
      ParseEnumFlag<bool>("onebit_mode", absl::GetFlag(FLAGS_onebit_mode),
                          {{"robust", true}, {"deepspeed", false}});
  if (!robust.ok()) return Fail(robust.status().message());
  o.preconditioned = *robust;
  if (!*robust) o.variance_floor = 0.0f;
  absl::StatusOr<bool> worker_momentum = ParseEnumFlag<bool>(
      "onebit_momentum", absl::GetFlag(FLAGS_onebit_momentum),
      {{"server", false}, {"worker", true}});
  if (!worker_momentum.ok()) return Fail(worker_momentum.status().message());
  o.worker_momentum = *worker_momentum;
  if (!absl::GetFlag(FLAGS_push_codec).empty()) {
    absl::StatusOr<v1::Codec> push =
        ParseCodecFlag("push_codec", absl::GetFlag(FLAGS_push_codec));
    if (!push.ok()) return Fail(push.status().message());
    config.push_codec = *push;
  }
  absl::StatusOr<v1::Codec> codec =
      ParseCodecFlag("pull_codec", absl::GetFlag(FLAGS_pull_codec));
  if (!codec.ok()) return Fail(codec.status().message());
  config.pull_codec = *codec;
  config.pull_params.set_block_size(absl::GetFlag(FLAGS_pull_block_size));
  config.pull_params.set_k_fraction(absl::GetFlag(FLAGS_pull_k_fraction));
  config.pull_params.set_bits(absl::GetFlag(FLAGS_pull_bits));
  absl::StatusOr<std::shared_ptr<const CompressionSchedule>> schedule =
      LoadScheduleFlag(absl::GetFlag(FLAGS_schedule));
  if (!schedule.ok()) return Fail(schedule.status().message());
  config.schedule = *std::move(schedule);
  if (config.schedule != nullptr) {
    if (absl::Status s =
            ApplyLearningRateSchedule(config.schedule->proto(), &o);
        !s.ok()) {
      return Fail(s.message());
    }
  }
  absl::StatusOr<Consistency> consistency =
      ParseConsistency(absl::GetFlag(FLAGS_consistency));
  if (!consistency.ok()) {
    return Fail(absl::StrCat("--", consistency.status().message()));
  }
  config.consistency.mode = *consistency;
  config.consistency.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  absl::StatusOr<bool> scaled = ParseEnumFlag<bool>(
      "staleness_scaling", absl::GetFlag(FLAGS_staleness_scaling),
      {{"none", false}, {"inverse", true}});
  if (!scaled.ok()) return Fail(scaled.status().message());
  config.consistency.scale_by_staleness = *scaled;
  config.consistency.patience = absl::GetFlag(FLAGS_ssp_patience);
  config.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  config.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  config.max_model_elements = absl::GetFlag(FLAGS_max_model_elements);
  config.chunk_elements = absl::GetFlag(FLAGS_chunk_elements);
  config.local_steps = absl::GetFlag(FLAGS_local_steps);
  double lease = absl::GetFlag(FLAGS_lease_timeout_seconds);
  if (!(lease >= 0) || lease > 86400) {
    return Fail(absl::StrCat("--lease_timeout_seconds is ", lease,
                             "; expected 0..86400"));
  }
  config.lease_timeout = absl::Seconds(lease);
  if (absl::Status s = ValidateShardConfig(config); !s.ok()) {
    return Fail(absl::StrCat("--", s.message()));
  }
  if (absl::StatusOr<std::unique_ptr<Codec>> c =
          MakeCodec(config.pull_codec, config.pull_params);
      !c.ok()) {
    return Fail(absl::StrCat("--pull_codec: ", c.status().message()));
  }
  int max_mb = absl::GetFlag(FLAGS_max_message_mb);
  if (max_mb < 1 || max_mb > 2047) {
    return Fail(absl::StrCat("--max_message_mb is ", max_mb,
                             "; expected 1..2047"));
  }
  const uint32_t quota_mb = absl::GetFlag(FLAGS_grpc_memory_mb);
  if (quota_mb != 0 && quota_mb < static_cast<uint32_t>(max_mb)) {
    return Fail(absl::StrCat("--grpc_memory_mb is ", quota_mb,
                             "; expected 0 (no quota) or at least "
                             "--max_message_mb (", max_mb, ")"));
  }
  int drain = absl::GetFlag(FLAGS_drain_seconds);
  if (drain < 0) {
    return Fail(absl::StrCat("--drain_seconds is ", drain, "; expected >= 0"));
  }
  absl::StatusOr<TransportSecurity> security = LoadSecurityFromFlags(
      {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
       absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_auth_token_file)},
      TransportSecurity::kServer);
  if (!security.ok()) return Fail(security.status().message());

  // Block the stop signals before any thread starts, then wait for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
      ServeMetrics(absl::GetFlag(FLAGS_metrics_listen), registry);
  if (!exposer.ok()) return Fail(exposer.status().message());
  ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.max_message_bytes = max_mb * (1 << 20);
  options.grpc_memory_bytes =
      size_t{absl::GetFlag(FLAGS_grpc_memory_mb)} << 20;
  options.security = *std::move(security);
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start(config, options, registry.get());
  if (!server.ok()) {
    return Fail(absl::StrCat("--listen: ", server.status().message()));
  }
  for (const std::string& line : (*server)->shard()->startup_log()) {
    std::fprintf(stderr, "pserver_server: %s\n", line.c_str());
  }
  std::fprintf(stderr,
               "pserver_server: shard %u/%u listening on port %d (metrics "
               "port %s), %u workers, %s rounds, optimizer %s%s, pull codec "
               "%s%s, %s, malloc %s\n",
               config.shard_index, config.num_shards, (*server)->port(),
               MetricsPortText(exposer->get()).c_str(), config.num_workers,
               DescribeConsistency(config.consistency).c_str(),
               OptimizerName(o.kind).c_str(),
               o.kind == OptimizerKind::kOneBitAdam
                   ? (o.worker_momentum ? " (momentum on the workers)"
                                        : " (momentum on the shard)")
                   : "",
               CodecName(config.pull_codec).c_str(),
               config.schedule == nullptr
                   ? ""
                   : absl::StrCat(", schedule ", absl::GetFlag(FLAGS_schedule),
                                  " (", config.schedule->num_phases(),
                                  " phases)")
                         .c_str(),
               SecuritySummary(options.security, TransportSecurity::kServer)
                   .c_str(),
               std::string(AllocatorName()).c_str());
  if (std::string port_file = absl::GetFlag(FLAGS_port_file);
      !port_file.empty()) {
    // Atomic, so readers never see a partial file.
    if (absl::Status s = WriteFileAtomically(
            port_file, absl::StrCat((*server)->port(), "\n"));
        !s.ok()) {
      return Fail(absl::StrCat("--port_file: ", s.message()));
    }
  }
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "pserver_server: %s, draining for up to %ds\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", drain);
  (*server)->Shutdown(absl::Seconds(drain));
  std::fprintf(stderr, "pserver_server: stopped\n");
  return 0;
}

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  pserver::ParseDaemonCommandLine(
      argc, argv,
      {"pserver_server",
       "One shard of the pserver parameter server.\n"
       "  pserver_server --shard_index=0 --num_shards=2 --num_workers=4",
       __FILE__});
  return pserver::Run();
}
