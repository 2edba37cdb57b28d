// pserver_worker: trains a model through the parameter server.
//
//   pserver_worker --servers=127.0.0.1:50051,127.0.0.1:50052 --worker_id=0
//                  --num_workers=4 --push_codec=onebit
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/codec.h"
#include "common/schedule.h"
#include "common/daemon/command_line.h"
#include "common/daemon/daemon_flags.h"
#include "tune/gradient_file.h"
#include "prometheus/registry.h"
#include "worker/client.h"
#include "worker/metrics.h"
#include "worker/mlp.h"
#include "worker/summary.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:50051",
          "comma-separated shard addresses, shard 0 first");
ABSL_FLAG(uint32_t, worker_id, 0, "this worker, 0 .. num_workers-1");
ABSL_FLAG(uint32_t, num_workers, 1, "workers in the job");
ABSL_FLAG(std::string, model, "mlp",
          "mlp (Fashion-MNIST) or synthetic (random gradients, any size)");
ABSL_FLAG(std::string, hidden, "256,128", "mlp hidden layer sizes");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "folder with the Fashion-MNIST IDX files (.gz or plain)");
ABSL_FLAG(int32_t, epochs, 5, "passes over the training set");
ABSL_FLAG(int64_t, steps, 0, "if > 0, stop after this many steps");
ABSL_FLAG(int32_t, batch_size, 32, "examples per step per worker");
ABSL_FLAG(bool, leave_on_sigterm, false,
          "on SIGTERM (a spot notice), save --state_file, leave the job at "
          "the next round boundary (the shards go on without this worker at "
          "once) and exit 0; a second SIGTERM ends it at once. Off: SIGTERM "
          "ends it, and the shards drop it when its lease runs out");
ABSL_FLAG(uint64_t, seed, 1, "model initialisation and data order");
ABSL_FLAG(std::string, init, "pytorch",
          "mlp initial weights: pytorch (nn.Linear's default, weights and "
          "biases uniform in +-1/sqrt(fan_in)) or he_normal (N(0, 2/fan_in) "
          "weights, zero biases)");
ABSL_FLAG(int64_t, train_subset, 0, "if > 0, train on the first N examples");
ABSL_FLAG(int64_t, test_subset, 0, "if > 0, test on the first N examples");
ABSL_FLAG(uint64_t, synthetic_params, 1 << 20, "synthetic model: parameters");
ABSL_FLAG(int32_t, synthetic_tensors, 4, "synthetic model: tensors");
ABSL_FLAG(std::string, push_codec, "onebit",
          "push codec (after 1-bit Adam's warmup, or always for adam/sgd): "
          "fp32, fp16, bf16, onebit, topk, randomk, quantize, topk_quantize, "
          "block_topk");
ABSL_FLAG(std::string, warmup_codec, "fp32",
          "push codec during 1-bit Adam's warmup (fp32, bf16, ...)");
ABSL_FLAG(std::string, schedule, "",
          "compression schedule file (JSON or text proto; docs/schedules.md), "
          "the same as the shards': the push codec of each phase of the run "
          "(phases without one use --push_codec / --warmup_codec)");
ABSL_FLAG(uint32_t, block_size, 256,
          "onebit/quantize: elements per scale block (0 = whole tensor); "
          "block_topk: elements per block, 4..64 (so set it, e.g. 16)");
ABSL_FLAG(std::string, onebit_scale, "mean_abs",
          "onebit block scale: mean_abs or l2 (DeepSpeed)");
ABSL_FLAG(double, k_fraction, 0.01, "topk/randomk: fraction of elements kept");
ABSL_FLAG(std::string, topk_selection, "sampled", "topk: sampled or exact");
ABSL_FLAG(std::string, value_format, "fp32", "topk/randomk values: fp32 or fp16");
ABSL_FLAG(uint32_t, bits, 8, "quantize: bits per level, 2..8");
ABSL_FLAG(std::string, rounding, "nearest", "quantize: nearest or stochastic");
ABSL_FLAG(std::string, quantize_range, "linear",
          "quantize: linear (block min/max) or adaptive (percentile clip)");
ABSL_FLAG(float, ef_decay, 1.0f, "error-feedback residual decay (1 = exact)");
ABSL_FLAG(bool, momentum_masking, false,
          "with a sparse --push_codec and the shards' "
          "--onebit_momentum=worker: the momentum of every element a push "
          "carried restarts from zero (Deep Gradient Compression's "
          "momentum-factor masking)");
ABSL_FLAG(int32_t, blas_threads, 1,
          "OpenBLAS threads (results are bit-reproducible per thread count)");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics listen address, host:port; empty disables");
ABSL_FLAG(double, log_interval, 5, "seconds between progress lines");
ABSL_FLAG(std::string, progress, "auto",
          "progress display: auto (a bar on a terminal), bar or lines");
ABSL_FLAG(double, rpc_timeout, 30, "seconds per push/register attempt");
ABSL_FLAG(double, pull_timeout, 120,
          "seconds per pull attempt (it waits for the slowest worker)");
ABSL_FLAG(double, retry_budget, 300,
          "seconds to keep retrying unavailable shards before giving up");
ABSL_FLAG(std::string, state_file, "",
          "keep this worker's error-feedback residuals here: loaded at start "
          "if present, saved every --state_every steps and at the end");
ABSL_FLAG(int64_t, state_every, 100, "steps between saves of --state_file");
ABSL_FLAG(int32_t, local_steps, 1,
          "local steps (DiLoCo): steps of Adam on this worker's own weights "
          "between pushes of its weight change (1: push every gradient; > 1 "
          "with shards running --optimizer=sgd --nesterov as the outer "
          "optimizer)");
ABSL_FLAG(float, inner_lr, 1e-3f, "local steps: the inner Adam's learning rate");
ABSL_FLAG(float, inner_weight_decay, 0.0f,
          "local steps: the inner Adam's decoupled weight decay");
ABSL_FLAG(double, compute_delay_ms, 0,
          "milliseconds added to every gradient's compute (a sleep): makes "
          "this worker a straggler on purpose, for benchmarks and tests");
ABSL_FLAG(int64_t, eval_every_steps, 0,
          "also evaluate on the test set every this many steps (0: only "
          "after each epoch); the summary JSON's evaluations list them with "
          "their times (tests/bench/straggler.sh)");
ABSL_FLAG(std::string, save_weights, "",
          "if set, write the final weights here as raw little-endian fp32");
ABSL_FLAG(std::string, summary_json, "",
          "if set, write the final summary (accuracy, bytes, time; per "
          "step: seconds, pushed and pulled payload bytes) here as JSON");
ABSL_FLAG(std::string, capture_gradients, "",
          "if set, write the raw gradients (before momentum, error feedback "
          "and compression) of the --capture_steps to this file "
          "(tune/gradient_file.h; tests/bench/codec_profile reads it)");
ABSL_FLAG(std::string, capture_deltas, "",
          "if set, write the change of this worker's weights over each of "
          "the --capture_steps (the pulled update) to this file, in the "
          "format of --capture_gradients (pserver_tune --deltas reads it; "
          "needs --local_steps=1)");
ABSL_FLAG(std::string, capture_steps, "",
          "steps whose gradients --capture_gradients (and weight deltas "
          "--capture_deltas) keeps: increasing steps or inclusive ranges, "
          "e.g. 0-19,1000-1019,2200-2219");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle the shards' certificates must chain to; turns on TLS "
          "(empty: plaintext)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate chain for mutual TLS (needs --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding the shared token sent on every call (needs --tls_ca; "
          "empty: the PSERVER_AUTH_TOKEN environment variable, if set)");

namespace pserver {
namespace {

std::atomic<bool> leave_requested{false};  // lock-free: set in a handler
static_assert(std::atomic<bool>::is_always_lock_free);

void OnSigterm(int) {
  leave_requested.store(true);
  signal(SIGTERM, SIG_DFL);  // a second one ends the process
}

int Fail(absl::string_view message) {
  std::fprintf(stderr, "pserver_worker: %s\n", std::string(message).c_str());
  return 2;
}

// The codec parameters of --push_codec and --warmup_codec (one set for
// both), from the flags.
absl::Status CodecParamsFromFlags(v1::Codec push, v1::Codec warmup,
                                  v1::CodecParams* p) {
  // --block_size is shared, and its default (256) is onebit's and quantize's:
  // name the flag here rather than let MakeCodec name params.block_size.
  const uint32_t block = absl::GetFlag(FLAGS_block_size);
  if ((push == v1::CODEC_BLOCK_TOPK || warmup == v1::CODEC_BLOCK_TOPK) &&
      (block < 4 || block > 64)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--block_size is ", block, "; expected 4..64 with block_topk (e.g. "
        "--block_size=16; the default 256 is for onebit and quantize)"));
  }
  p->set_block_size(block);
  absl::StatusOr<v1::ScaleMode> scale = ParseEnumFlag<v1::ScaleMode>(
      "onebit_scale", absl::GetFlag(FLAGS_onebit_scale),
      {{"mean_abs", v1::SCALE_MODE_MEAN_ABS}, {"l2", v1::SCALE_MODE_L2}});
  if (!scale.ok()) return scale.status();
  p->set_scale_mode(*scale);
  p->set_k_fraction(absl::GetFlag(FLAGS_k_fraction));
  absl::StatusOr<v1::TopKSelection> sel = ParseEnumFlag<v1::TopKSelection>(
      "topk_selection", absl::GetFlag(FLAGS_topk_selection),
      {{"sampled", v1::TOPK_SELECTION_SAMPLED},
       {"exact", v1::TOPK_SELECTION_EXACT}});
  if (!sel.ok()) return sel.status();
  p->set_selection(*sel);
  absl::StatusOr<v1::ValueFormat> vf = ParseEnumFlag<v1::ValueFormat>(
      "value_format", absl::GetFlag(FLAGS_value_format),
      {{"fp32", v1::VALUE_FORMAT_FP32}, {"fp16", v1::VALUE_FORMAT_FP16}});
  if (!vf.ok()) return vf.status();
  p->set_value_format(*vf);
  p->set_bits(absl::GetFlag(FLAGS_bits));
  absl::StatusOr<v1::Rounding> r = ParseEnumFlag<v1::Rounding>(
      "rounding", absl::GetFlag(FLAGS_rounding),
      {{"nearest", v1::ROUNDING_NEAREST},
       {"stochastic", v1::ROUNDING_STOCHASTIC}});
  if (!r.ok()) return r.status();
  p->set_rounding(*r);
  absl::StatusOr<v1::QuantizeRange> q = ParseEnumFlag<v1::QuantizeRange>(
      "quantize_range", absl::GetFlag(FLAGS_quantize_range),
      {{"linear", v1::QUANTIZE_RANGE_LINEAR},
       {"adaptive", v1::QUANTIZE_RANGE_ADAPTIVE}});
  if (!q.ok()) return q.status();
  p->set_range(*q);
  return absl::OkStatus();
}

int Run() {
  ClientOptions c;
  c.server_addresses = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',',
                                      absl::SkipWhitespace());
  if (c.server_addresses.empty()) {
    return Fail("--servers is empty; expected host:port[,host:port...]");
  }
  c.worker_id = absl::GetFlag(FLAGS_worker_id);
  c.num_workers = absl::GetFlag(FLAGS_num_workers);
  if (c.num_workers == 0 || c.worker_id >= c.num_workers) {
    return Fail(absl::StrCat("--worker_id is ", c.worker_id,
                             "; expected 0..num_workers-1 (--num_workers is ",
                             c.num_workers, ")"));
  }
  absl::StatusOr<v1::Codec> push =
      ParseCodecFlag("push_codec", absl::GetFlag(FLAGS_push_codec));
  if (!push.ok()) return Fail(push.status().message());
  absl::StatusOr<v1::Codec> warm =
      ParseCodecFlag("warmup_codec", absl::GetFlag(FLAGS_warmup_codec));
  if (!warm.ok()) return Fail(warm.status().message());
  c.push_codec = *push;
  c.warmup_codec = *warm;
  if (absl::Status s = CodecParamsFromFlags(c.push_codec, c.warmup_codec,
                                            &c.push_params);
      !s.ok()) {
    return Fail(s.message());
  }
  c.warmup_params = c.push_params;
  absl::StatusOr<std::shared_ptr<const CompressionSchedule>> schedule =
      LoadScheduleFlag(absl::GetFlag(FLAGS_schedule));
  if (!schedule.ok()) return Fail(schedule.status().message());
  c.schedule = *std::move(schedule);
  c.ef_decay = absl::GetFlag(FLAGS_ef_decay);
  c.momentum_masking = absl::GetFlag(FLAGS_momentum_masking);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout));
  c.pull_timeout = absl::Seconds(absl::GetFlag(FLAGS_pull_timeout));
  c.retry_budget = absl::Seconds(absl::GetFlag(FLAGS_retry_budget));
  absl::StatusOr<TransportSecurity> security = LoadSecurityFromFlags(
      {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
       absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_auth_token_file)},
      TransportSecurity::kClient);
  if (!security.ok()) return Fail(security.status().message());
  c.security = *std::move(security);
  // Shards retried, answering again, rejoined: one line each on stderr.
  c.log = [id = c.worker_id](absl::string_view line) {
    std::fprintf(stderr, "pserver_worker %u: %s\n", id,
                 std::string(line).c_str());
  };

  TrainerOptions t;
  absl::StatusOr<std::string> model = ParseEnumFlag<std::string>(
      "model", absl::GetFlag(FLAGS_model),
      {{"mlp", "mlp"}, {"synthetic", "synthetic"}});
  if (!model.ok()) return Fail(model.status().message());
  t.model = *model;
  t.hidden.clear();
  for (absl::string_view h :
       absl::StrSplit(absl::GetFlag(FLAGS_hidden), ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(h, &v) || v <= 0) {
      return Fail(absl::StrCat("--hidden has '", h,
                               "'; expected positive integers like 256,128"));
    }
    t.hidden.push_back(v);
  }
  t.data_dir = absl::GetFlag(FLAGS_data_dir);
  t.epochs = absl::GetFlag(FLAGS_epochs);
  t.steps = absl::GetFlag(FLAGS_steps);
  t.batch_size = absl::GetFlag(FLAGS_batch_size);
  t.seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<InitScheme> init = ParseEnumFlag<InitScheme>(
      "init", absl::GetFlag(FLAGS_init),
      {{"pytorch", InitScheme::kPyTorch},
       {"he_normal", InitScheme::kHeNormal}});
  if (!init.ok()) return Fail(init.status().message());
  t.init = *init;
  t.train_subset = absl::GetFlag(FLAGS_train_subset);
  t.test_subset = absl::GetFlag(FLAGS_test_subset);
  t.synthetic_params = absl::GetFlag(FLAGS_synthetic_params);
  t.synthetic_tensors = absl::GetFlag(FLAGS_synthetic_tensors);
  t.log_interval_seconds = absl::GetFlag(FLAGS_log_interval);
  t.state_file = absl::GetFlag(FLAGS_state_file);
  t.state_every = absl::GetFlag(FLAGS_state_every);
  t.local_steps = absl::GetFlag(FLAGS_local_steps);
  c.local_steps = t.local_steps < 1 ? 1 : static_cast<uint32_t>(t.local_steps);
  const double delay_ms = absl::GetFlag(FLAGS_compute_delay_ms);
  if (!(delay_ms >= 0 && delay_ms <= 60000)) {
    return Fail(absl::StrCat("--compute_delay_ms is ", delay_ms,
                             "; expected 0..60000"));
  }
  t.compute_delay = absl::Milliseconds(delay_ms);
  t.eval_every_steps = absl::GetFlag(FLAGS_eval_every_steps);
  if (t.eval_every_steps < 0) {
    return Fail(absl::StrCat("--eval_every_steps is ", t.eval_every_steps,
                             "; expected >= 0"));
  }
  t.inner.lr = absl::GetFlag(FLAGS_inner_lr);
  t.inner.weight_decay = absl::GetFlag(FLAGS_inner_weight_decay);
  t.capture_file = absl::GetFlag(FLAGS_capture_gradients);
  t.capture_deltas_file = absl::GetFlag(FLAGS_capture_deltas);
  const std::string capture_steps = absl::GetFlag(FLAGS_capture_steps);
  const bool capturing =
      !t.capture_file.empty() || !t.capture_deltas_file.empty();
  if (capturing != !capture_steps.empty()) {
    return Fail(capturing
                    ? absl::StrCat("--", t.capture_file.empty()
                                             ? "capture_deltas"
                                             : "capture_gradients",
                                   " is set without --capture_steps; "
                                   "expected both or neither")
                    : "--capture_steps is set without --capture_gradients "
                      "or --capture_deltas; expected both or neither");
  }
  if (!t.capture_deltas_file.empty() && t.local_steps != 1) {
    return Fail(absl::StrCat("--capture_deltas is set with --local_steps=",
                             t.local_steps, "; expected --local_steps=1"));
  }
  if (!capture_steps.empty()) {
    absl::StatusOr<StepRanges> steps = StepRanges::Parse(capture_steps);
    if (!steps.ok()) {
      return Fail(absl::StrCat("--capture_steps ", steps.status().message()));
    }
    t.capture_steps = *std::move(steps);
  }
  enum class Progress { kAuto, kBar, kLines };
  absl::StatusOr<Progress> progress = ParseEnumFlag<Progress>(
      "progress", absl::GetFlag(FLAGS_progress),
      {{"auto", Progress::kAuto},
       {"bar", Progress::kBar},
       {"lines", Progress::kLines}});
  if (!progress.ok()) return Fail(progress.status().message());
  t.progress_bar = *progress == Progress::kAuto ? isatty(STDOUT_FILENO) != 0
                                                : *progress == Progress::kBar;
  if (t.epochs <= 0 && t.steps <= 0) {
    return Fail("--epochs and --steps are both <= 0; expected one positive");
  }
  int blas = absl::GetFlag(FLAGS_blas_threads);
  if (blas < 1) {
    return Fail(absl::StrCat("--blas_threads is ", blas, "; expected >= 1"));
  }
  SetBlasThreads(blas);
  if (absl::GetFlag(FLAGS_leave_on_sigterm)) {
    t.leave_requested = &leave_requested;
    signal(SIGTERM, OnSigterm);
  }

  // Every flag is checked before the first connection. The client counts
  // into the registry the metrics endpoint exports.
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(c, registry.get());
  if (!client.ok()) return Fail(client.status().message());
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
      ServeMetrics(absl::GetFlag(FLAGS_metrics_listen), registry);
  if (!exposer.ok()) return Fail(exposer.status().message());
  WorkerMetrics metrics(*registry);
  absl::StatusOr<TrainResult> r = RunTraining(
      t, client->get(), &metrics, stdout, c.worker_id, c.num_workers);
  if (!r.ok()) return Fail(r.status().message());
  const ClientStats& s = r->stats;
  if (r->left_at_step.has_value()) {
    std::printf("worker %u left the job at step %llu (SIGTERM); the shards "
                "go on without it%s\n",
                c.worker_id, static_cast<unsigned long long>(*r->left_at_step),
                t.state_file.empty() ? ""
                                     : "; its --state_file lets it return");
    std::fflush(stdout);
    return 0;
  }
  std::printf(
      "worker %u done: %d steps in %.1f s, test accuracy %.4f, pushed %.0f "
      "bytes (%.1fx less than fp32), pulled %.0f bytes (%.1fx less)\n",
      c.worker_id, static_cast<int>(r->steps), r->wall_seconds,
      r->test_accuracy, static_cast<double>(s.push_payload_bytes),
      s.push_payload_bytes ? double(s.push_fp32_bytes) / s.push_payload_bytes
                           : 0.0,
      static_cast<double>(s.pull_payload_bytes),
      s.pull_payload_bytes ? double(s.pull_fp32_bytes) / s.pull_payload_bytes
                           : 0.0);
  if (std::string path = absl::GetFlag(FLAGS_save_weights); !path.empty()) {
    std::ofstream out(path, std::ios::binary);
    absl::Span<const float> w = (*client)->weights();  // the final replica
    out.write(reinterpret_cast<const char*>(w.data()),
              static_cast<std::streamsize>(w.size() * 4));
    if (!out.good()) return Fail(absl::StrCat("--save_weights ", path,
                                              ": cannot write"));
  }
  std::string summary = absl::GetFlag(FLAGS_summary_json);
  if (!summary.empty()) WriteSummary(summary, t, c, *r);
  return 0;
}

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  pserver::ParseDaemonCommandLine(
      argc, argv,
      {"pserver_worker",
       "Trains a model through pserver shards.\n"
       "  pserver_worker --servers=HOST:PORT,... --worker_id=0 "
       "--num_workers=4",
       __FILE__});
  return pserver::Run();
}
