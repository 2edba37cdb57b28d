#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "worker/batcher.h"
#include "worker/idx_reader.h"
#include "worker/mlp.h"
#include "worker/rng.h"

namespace pserver {
namespace {

std::string Bytes(double b) {
  const char* unit[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return absl::StrFormat("%.1f %s", b, unit[u]);
}

double Ratio(uint64_t fp32, uint64_t sent) {
  return sent == 0 ? 0.0 : static_cast<double>(fp32) / sent;
}

// Progress output: a line every log_interval seconds, or a redrawn bar.
class Progress {
 public:
  Progress(const TrainerOptions& o, FILE* log, uint32_t worker, int64_t total)
      : o_(o), log_(log), worker_(worker), total_(total),
        start_(absl::Now()), last_(start_) {}

  void Update(int64_t step, int64_t epoch, double loss, const ClientStats& s,
              bool force) {
    if (log_ == nullptr) return;
    absl::Time now = absl::Now();
    double since = absl::ToDoubleSeconds(now - last_);
    if (!force && since < (o_.progress_bar ? 0.2 : o_.log_interval_seconds)) {
      return;
    }
    double rate = (step - last_step_) / std::max(since, 1e-9);
    last_ = now;
    last_step_ = step;
    std::string text = absl::StrFormat(
        "worker %u step %d/%d epoch %d loss %.4f %.1f steps/s pushed %s "
        "pulled %s ratio %.1fx",
        worker_, step, total_, epoch, loss, rate,
        Bytes(s.push_payload_bytes), Bytes(s.pull_payload_bytes),
        Ratio(s.push_fp32_bytes + s.pull_fp32_bytes,
              s.push_payload_bytes + s.pull_payload_bytes));
    if (o_.progress_bar) {
      int width = 24;
      int filled = total_ > 0 ? static_cast<int>(width * step / total_) : 0;
      std::string bar(filled, '#');
      bar.resize(width, '.');
      std::fprintf(log_, "\r[%s] %s\x1b[K", bar.c_str(), text.c_str());
      if (force) std::fprintf(log_, "\n");
    } else {
      std::fprintf(log_, "%s\n", text.c_str());
    }
    std::fflush(log_);
  }

 private:
  const TrainerOptions& o_;
  FILE* log_;
  uint32_t worker_;
  int64_t total_;
  absl::Time start_, last_;
  int64_t last_step_ = 0;
};

void LoadWorkerState(const TrainerOptions& o, Client* client, FILE* log,
                     uint32_t worker_id) {
  if (o.state_file.empty()) return;
  absl::Status s = client->LoadState(o.state_file);
  if (log == nullptr) return;
  if (s.ok()) {
    std::fprintf(log, "worker %u: error-feedback residuals restored from %s\n",
                 worker_id, o.state_file.c_str());
  } else if (!absl::IsNotFound(s)) {
    std::fprintf(log, "worker %u: residuals not restored (%s); starting from "
                 "zero\n", worker_id, std::string(s.message()).c_str());
  }
}

void SaveWorkerState(const TrainerOptions& o, const Client& client, FILE* log,
                     bool last) {
  if (o.state_file.empty()) return;
  if (!last && (o.state_every <= 0 ||
                client.step() % static_cast<uint64_t>(o.state_every) != 0)) {
    return;
  }
  if (absl::Status s = client.SaveState(o.state_file); !s.ok() && log) {
    std::fprintf(log, "worker: saving residuals failed: %s\n",
                 std::string(s.message()).c_str());
  }
}

v1::ModelLayout ToLayout(const std::vector<ParamTensor>& tensors) {
  v1::ModelLayout l;
  for (const ParamTensor& t : tensors) {
    v1::TensorSpec* spec = l.add_tensors();
    spec->set_name(t.name);
    for (uint64_t d : t.shape) spec->add_shape(d);
  }
  return l;
}

Dataset Prefix(Dataset d, int64_t n) {
  if (n <= 0 || n >= d.size) return d;
  d.size = n;
  d.images.resize(static_cast<size_t>(n) * d.features());
  d.labels.resize(static_cast<size_t>(n));
  return d;
}

absl::StatusOr<TrainResult> TrainMlp(const TrainerOptions& o, Client* client,
                                     WorkerMetrics* metrics, FILE* log,
                                     uint32_t worker_id, uint32_t num_workers) {
  absl::StatusOr<Dataset> train = LoadFashionMnist(o.data_dir, DataSplit::kTrain);
  if (!train.ok()) return train.status();
  absl::StatusOr<Dataset> test = LoadFashionMnist(o.data_dir, DataSplit::kTest);
  if (!test.ok()) return test.status();
  *train = Prefix(*std::move(train), o.train_subset);
  *test = Prefix(*std::move(test), o.test_subset);
  absl::StatusOr<Mlp> mlp =
      Mlp::Create(train->features(), o.hidden, std::max(10, train->num_classes));
  if (!mlp.ok()) return mlp.status();
  if (absl::Status s = mlp->CheckData(*train); !s.ok()) return s;
  absl::StatusOr<Batcher> batcher =
      Batcher::Create(train->size, static_cast<int>(num_workers),
                      static_cast<int>(worker_id), o.batch_size, o.seed);
  if (!batcher.ok()) return batcher.status();

  std::vector<float> init = mlp->InitParams(o.seed);
  if (absl::Status s = client->Register(ToLayout(mlp->layout()), init);
      !s.ok()) {
    return s;
  }
  LoadWorkerState(o, client, log, worker_id);
  const int64_t total = o.steps > 0 ? o.steps
                                    : o.epochs * batcher->steps_per_epoch();
  std::vector<float> x(static_cast<size_t>(o.batch_size) * train->features());
  std::vector<uint8_t> y(o.batch_size);
  std::vector<float> grad(mlp->num_params());
  TrainResult result;
  Progress progress(o, log, worker_id, total);
  absl::Time start = absl::Now();
  auto evaluate = [&](int64_t epoch) {
    EvalResult e = mlp->Evaluate(client->weights(), *test);
    result.test_accuracy = e.accuracy;
    result.test_loss = e.mean_loss;
    if (metrics) metrics->SetTestAccuracy(e.accuracy, e.mean_loss);
    if (log) {
      std::fprintf(log, "%sworker %u epoch %ld test accuracy %.4f loss %.4f\n",
                   o.progress_bar ? "\n" : "", worker_id, static_cast<long>(epoch), e.accuracy,
                   e.mean_loss);
    }
  };
  // The client's step leads: a worker that joins late starts at the shards'
  // step, and one that was dropped from a round skips ahead with it.
  while (static_cast<int64_t>(client->step()) < total) {
    const int64_t step = static_cast<int64_t>(client->step());
    absl::Time t0 = absl::Now();
    GatherBatch(*train, batcher->WorkerBatch(step), x.data(), y.data());
    float loss = mlp->LossAndGradient(client->weights(), x.data(), y.data(),
                                      o.batch_size, absl::MakeSpan(grad));
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat(
          "training diverged: loss is ", loss, " at step ", step));
    }
    if (absl::Status s = client->Step(grad); !s.ok()) return s;
    result.last_loss = loss;
    int64_t done = static_cast<int64_t>(client->step());
    int64_t epoch = step / batcher->steps_per_epoch();
    if (metrics) {
      metrics->ObserveStep(absl::ToDoubleSeconds(absl::Now() - t0), done, loss);
      metrics->Update(client->stats(), client->ResidualNorm());
    }
    progress.Update(done, epoch, loss, client->stats(), done >= total);
    SaveWorkerState(o, *client, log, done >= total);
    if (o.evaluate_each_epoch && done % batcher->steps_per_epoch() == 0 &&
        done < total) {
      evaluate(done / batcher->steps_per_epoch());
    }
  }
  result.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  evaluate((total + batcher->steps_per_epoch() - 1) /
           batcher->steps_per_epoch());
  result.steps = total;
  result.stats = client->stats();
  result.final_weights.assign(client->weights().begin(),
                              client->weights().end());
  return result;
}

absl::StatusOr<TrainResult> TrainSynthetic(const TrainerOptions& o,
                                           Client* client,
                                           WorkerMetrics* metrics, FILE* log,
                                           uint32_t worker_id) {
  if (o.synthetic_params == 0 || o.synthetic_tensors <= 0 ||
      static_cast<uint64_t>(o.synthetic_tensors) > o.synthetic_params) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic_params is ", o.synthetic_params, " in ",
        o.synthetic_tensors, " tensors; expected 1 <= tensors <= params"));
  }
  v1::ModelLayout layout;
  uint64_t left = o.synthetic_params;
  for (int t = 0; t < o.synthetic_tensors; ++t) {
    uint64_t size = left / (o.synthetic_tensors - t);
    left -= size;
    v1::TensorSpec* spec = layout.add_tensors();
    spec->set_name(absl::StrCat("synthetic.", t));
    spec->add_shape(size);
  }
  const uint64_t n = o.synthetic_params;
  std::vector<float> init(n);
  SplitMix64 rng(DeriveSeed(o.seed, 1));
  for (float& v : init) v = static_cast<float>(rng.NextDouble() - 0.5) * 0.1f;
  if (absl::Status s = client->Register(layout, init); !s.ok()) return s;
  // One buffer of seeded noise; each step reads it from a step-dependent
  // rotation, so gradients differ by step and worker at memcpy cost.
  std::vector<float> noise(n);
  SplitMix64 g(DeriveSeed(o.seed, 1000 + worker_id));
  for (float& v : noise) v = static_cast<float>(g.NextDouble() - 0.5) * 0.01f;
  std::vector<float> grad(n);
  const int64_t total = o.steps > 0 ? o.steps : 100;
  TrainResult result;
  Progress progress(o, log, worker_id, total);
  absl::Time start = absl::Now();
  while (static_cast<int64_t>(client->step()) < total) {
    const int64_t step = static_cast<int64_t>(client->step());
    absl::Time t0 = absl::Now();
    uint64_t shift = Mix64(static_cast<uint64_t>(step)) % n;
    std::memcpy(grad.data(), noise.data() + shift, (n - shift) * sizeof(float));
    std::memcpy(grad.data() + (n - shift), noise.data(), shift * sizeof(float));
    if (absl::Status s = client->Step(grad); !s.ok()) return s;
    if (metrics) {
      metrics->ObserveStep(absl::ToDoubleSeconds(absl::Now() - t0),
                           client->step(), 0.0);
      metrics->Update(client->stats(), client->ResidualNorm());
    }
    int64_t done = static_cast<int64_t>(client->step());
    progress.Update(done, 0, 0.0, client->stats(), done >= total);
  }
  result.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.steps = total;
  result.stats = client->stats();
  return result;
}

}  // namespace

absl::StatusOr<TrainResult> RunTraining(const TrainerOptions& options,
                                        Client* client,
                                        WorkerMetrics* metrics, FILE* log,
                                        uint32_t worker_id,
                                        uint32_t num_workers) {
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_size is ", options.batch_size, "; expected > 0"));
  }
  if (options.model == "mlp") {
    return TrainMlp(options, client, metrics, log, worker_id, num_workers);
  }
  if (options.model == "synthetic") {
    return TrainSynthetic(options, client, metrics, log, worker_id);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model is '", options.model, "'; expected mlp or synthetic"));
}

}  // namespace pserver
