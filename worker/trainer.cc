#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/norms.h"
#include "common/process_stats.h"
#include "common/thread_pool.h"
#include "worker/diagnostics.h"
#include "worker/workloads.h"

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

// Appends the steps of o.capture_steps to `file` (o.capture_file: the
// gradients; o.capture_deltas_file: the replica's changes).
class Capture {
 public:
  static absl::StatusOr<Capture> Open(const TrainerOptions& o,
                                      const std::string& file,
                                      const v1::ModelLayout& layout,
                                      uint32_t worker_id) {
    Capture c;
    if (file.empty()) return c;
    if (!o.capture_steps.has_value()) {
      return absl::InvalidArgumentError(
          "capture_steps is unset; expected the steps to capture");
    }
    absl::StatusOr<std::unique_ptr<GradientFileWriter>> w =
        GradientFileWriter::Create(file, layout, worker_id);
    if (!w.ok()) return w.status();
    c.writer_ = *std::move(w);
    c.steps_ = &*o.capture_steps;
    return c;
  }

  bool Wants(int64_t step) const {
    return writer_ != nullptr && step >= 0 &&
           steps_->Contains(static_cast<uint64_t>(step));
  }

  absl::Status Step(int64_t step, absl::Span<const float> grad) {
    if (!Wants(step)) return absl::OkStatus();
    return writer_->Append(static_cast<uint64_t>(step), grad);
  }

  // `what`: "gradients" or "weight deltas", for the log line.
  absl::Status Finish(const std::string& path, const char* what, FILE* log,
                      uint32_t worker) {
    if (writer_ == nullptr) return absl::OkStatus();
    absl::Status s = writer_->Close();
    if (s.ok() && log != nullptr) {
      std::fprintf(log, "worker %u: captured the %s of %lu steps to %s\n",
                   worker, what,
                   static_cast<unsigned long>(writer_->steps_written()),
                   path.c_str());
    }
    return s;
  }

 private:
  std::unique_ptr<GradientFileWriter> writer_;
  const StepRanges* steps_ = nullptr;
};

}  // namespace

absl::StatusOr<TrainResult> RunTraining(const TrainerOptions& o,
                                        Client* client,
                                        WorkerMetrics* metrics, FILE* log,
                                        uint32_t worker_id,
                                        uint32_t num_workers) {
  if (o.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", o.batch_size, "; expected > 0"));
  }
  if (o.local_steps < 1 || o.local_steps > kMaxLocalSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_steps is ", o.local_steps, "; expected 1..",
                     kMaxLocalSteps));
  }
  if (o.local_steps > 1) {
    if (absl::Status s = InnerAdam::Validate(o.inner); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<Workload>> made;
  if (o.model == "mlp") {
    made = MakeMlpWorkload(o, worker_id, num_workers);
  } else if (o.model == "synthetic") {
    made = MakeSyntheticWorkload(o, worker_id);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model is '", o.model, "'; expected mlp or synthetic"));
  }
  if (!made.ok()) return made.status();
  Workload& model = **made;
  if (!o.capture_deltas_file.empty() && o.local_steps != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capture_deltas_file is set with local_steps ", o.local_steps,
        "; expected local_steps 1"));
  }
  absl::StatusOr<Capture> capture =
      Capture::Open(o, o.capture_file, model.layout(), worker_id);
  if (!capture.ok()) return capture.status();
  absl::StatusOr<Capture> deltas =
      Capture::Open(o, o.capture_deltas_file, model.layout(), worker_id);
  if (!deltas.ok()) return deltas.status();
  std::vector<float> before;  // the replica at the start of a captured step
  // The residual norm is a pass over every residual: only when exported.
  const bool exported = metrics != nullptr;
  std::unique_ptr<WorkerMetrics> unexported;
  if (metrics == nullptr) {
    unexported = WorkerMetrics::Unexported();
    metrics = unexported.get();
  }

  const int64_t total = model.total_steps();
  // The run's length in rounds (pushes), for a schedule's fractions.
  client->SetRunLength(static_cast<uint64_t>(
      (total + o.local_steps - 1) / std::max(1, o.local_steps)));
  if (absl::Status s = client->Register(model.layout(), model.InitialWeights());
      !s.ok()) {
    return s;
  }
  LoadWorkerState(o, client, log, worker_id);
  const int64_t per_epoch = model.steps_per_epoch();
  std::vector<float> grad(client->num_params());
  TrainResult result;
  Progress progress(o, log, worker_id, total);
  absl::Time start = absl::Now();
  uint64_t pushed = client->stats().push_payload_bytes;
  uint64_t pulled = client->stats().pull_payload_bytes;
  ProcessUsage used = ReadProcessUsage();
  auto evaluate = [&](int64_t epoch, int64_t step) {
    std::optional<EvalResult> e = model.Evaluate(client->weights());
    if (!e.has_value()) return;
    result.test_accuracy = e->accuracy;
    result.test_loss = e->mean_loss;
    result.evaluations.push_back(
        {step, absl::ToDoubleSeconds(absl::Now() - start), e->accuracy});
    metrics->SetTestAccuracy(e->accuracy, e->mean_loss);
    if (log) {
      std::fprintf(log, "%sworker %u epoch %ld test accuracy %.4f loss %.4f\n",
                   o.progress_bar ? "\n" : "", worker_id,
                   static_cast<long>(epoch), e->accuracy, e->mean_loss);
    }
  };
  // After each push: the step's record, metrics, progress, the state file,
  // and an evaluation when the step (or round) crossed into a new epoch.
  // `first` is the first data step it covered, `done` the data steps done.
  uint32_t phase = client->schedule_phase();
  // Diagnostics (worker/diagnostics.h): the gradient's norm is a pass over
  // it, so on large models it is sampled every few steps.
  TrainingDiagnostics diagnostics;
  const int64_t norm_stride =
      std::max<int64_t>(1, static_cast<int64_t>(grad.size() >> 22));
  auto diagnose = [&](const StepSample& sample) {
    std::vector<Finding> found = diagnostics.Observe(sample);
    metrics->ObserveDiagnostics(sample, diagnostics, found);
    result.communication_share = diagnostics.communication_share();
    for (const Finding& f : found) {
      ++result.diagnostics[DiagnosticName(f.kind)];
      if (log != nullptr) {
        std::fprintf(log, "%sworker %u %s\n", o.progress_bar ? "\n" : "",
                     worker_id, f.message.c_str());
      }
    }
  };
  // A non-finite loss is reported before the step that would send it fails.
  auto check_loss = [&](int64_t step, double loss) {
    if (!std::isfinite(loss)) {
      StepSample sample;
      sample.step = step;
      sample.loss = loss;
      diagnose(sample);
    }
  };
  auto gradient_norm = [&](int64_t step) {
    if (step % norm_stride != 0) return 0.0;
    // In 8 lanes (common/norms.h): one serial chain of double adds took
    // ~4 cycles an element, 7% of a 25M worker's CPU at this stride.
    return std::sqrt(SquaredNorm(grad, ThreadPool::Default()));
  };
  // `compute`: the step's forward and backward time; `gnorm`: ||g|| (0:
  // not sampled).
  auto after_step = [&](absl::Time t0, int64_t first, int64_t done,
                        double compute, double gnorm) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    if (client->schedule_phase() != phase && log != nullptr &&
        client->options().schedule != nullptr) {
      phase = client->schedule_phase();
      const CompressionSchedule& s = *client->options().schedule;
      const CodecChoiceSpec* push = s.push(phase);
      std::fprintf(log,
                   "%sworker %u round %lu: schedule phase %u (%s): push %s\n",
                   o.progress_bar ? "\n" : "", worker_id,
                   static_cast<unsigned long>(client->step()), phase,
                   s.PhaseName(phase).c_str(),
                   push != nullptr ? push->Describe().c_str()
                                   : "by --push_codec/--warmup_codec");
    }
    const ClientStats& now = client->stats();
    const ProcessUsage usage = ReadProcessUsage();
    result.step_log.push_back({seconds, now.push_payload_bytes - pushed,
                               now.pull_payload_bytes - pulled,
                               usage.minor_faults - used.minor_faults,
                               usage.cpu_seconds - used.cpu_seconds});
    pushed = now.push_payload_bytes;
    pulled = now.pull_payload_bytes;
    used = usage;
    metrics->ObserveStep(seconds, done, result.last_loss);
    StepSample sample;
    sample.step = first;
    sample.loss = result.last_loss;
    sample.gradient_norm = gnorm;
    // After 1-bit Adam's freeze the residual lives in the preconditioned
    // space, not comparable with ||g||: that check covers the warmup and
    // the optimizers without a freeze.
    sample.residual_norm =
        gnorm > 0 && client->stage() != v1::OPTIMIZER_STAGE_COMPRESSION
            ? client->ResidualNorm()
            : -1;
    sample.compute_seconds = std::min(compute, seconds);
    sample.communication_seconds = seconds - sample.compute_seconds;
    sample.pushed_bytes = result.step_log.back().push_bytes;
    diagnose(sample);
    // A sum over the residuals' pieces (error_feedback.h): cheap.
    if (exported) metrics->SetResidualNorm(client->ResidualNorm());
    progress.Update(done, per_epoch > 0 ? first / per_epoch : 0,
                    result.last_loss, now, done >= total);
    SaveWorkerState(o, *client, log, done >= total);
    if (o.evaluate_each_epoch && per_epoch > 0 && done < total &&
        first / per_epoch != done / per_epoch) {
      evaluate(done / per_epoch, done);
    } else if (o.eval_every_steps > 0 && done < total &&
               first / o.eval_every_steps != done / o.eval_every_steps) {
      evaluate(per_epoch > 0 ? done / per_epoch : 0, done);
    }
  };
  const auto leaving = [&] {
    return o.leave_requested != nullptr && o.leave_requested->load();
  };
  if (o.local_steps > 1) {
    // DiLoCo: H steps of Adam on a local copy from the round's weights,
    // then the weight change goes out as the round's "gradient". The
    // shards' step counts rounds; steps and epochs count local steps.
    const int64_t h = o.local_steps;
    const int64_t rounds = (total + h - 1) / h;
    InnerAdam inner(o.inner, grad.size());
    std::vector<float> local(grad.size());
    while (static_cast<int64_t>(client->step()) < rounds) {
      const absl::Time t0 = absl::Now();
      const int64_t first = static_cast<int64_t>(client->step()) * h;
      const int64_t last = std::min(total, first + h);
      absl::Span<const float> replica = client->weights();
      std::copy(replica.begin(), replica.end(), local.begin());
      for (int64_t step = first; step < last; ++step) {
        absl::StatusOr<double> loss =
            model.Gradient(step, local, absl::MakeSpan(grad));
        if (!loss.ok()) return loss.status();
        if (absl::Status s = capture->Step(step, grad); !s.ok()) return s;
        if (o.compute_delay > absl::ZeroDuration()) {
          absl::SleepFor(o.compute_delay);
        }
        result.last_loss = *loss;
        check_loss(step, *loss);
        inner.Step(grad, absl::MakeSpan(local));
      }
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = replica[i] - local[i];
      const double compute = absl::ToDoubleSeconds(absl::Now() - t0);
      const double gnorm = gradient_norm(first / h);
      if (absl::Status s = client->Step(grad); !s.ok()) return s;
      after_step(t0, first,
                 std::min(total, static_cast<int64_t>(client->step()) * h),
                 compute, gnorm);
      if (leaving()) break;
    }
  }
  // The client's step leads: a worker that joins late starts at the shards'
  // step, and one that was dropped from a round skips ahead with it. Under
  // --consistency=async every push is a shard step of its own, so the run
  // is this worker's own `total` steps instead (the same data as bsp).
  const bool own_count = client->consistency() == v1::CONSISTENCY_ASYNC;
  int64_t own = 0;
  while (o.local_steps == 1 && !leaving() &&
         (own_count ? own : static_cast<int64_t>(client->step())) < total) {
    const int64_t step = own_count ? own : static_cast<int64_t>(client->step());
    const absl::Time t0 = absl::Now();
    const bool delta_step = deltas->Wants(step);
    if (delta_step) {
      before.assign(client->weights().begin(), client->weights().end());
    }
    // Overlapped: each layer's gradient is pushed as backward finishes it
    // (last layer first) while the earlier layers are computed.
    if (absl::Status s = client->StartStep(grad); !s.ok()) return s;
    absl::Status handed = absl::OkStatus();
    absl::StatusOr<double> loss = model.Gradient(
        step, client->weights(), absl::MakeSpan(grad),
        [&](uint64_t b, uint64_t e) {
          if (handed.ok()) handed = client->GradientReady(b, e);
        });
    if (!loss.ok()) return loss.status();
    if (o.compute_delay > absl::ZeroDuration()) absl::SleepFor(o.compute_delay);
    const double compute = absl::ToDoubleSeconds(absl::Now() - t0);
    check_loss(step, *loss);
    if (!handed.ok()) return handed;
    // While the pusher encodes: grad is complete and no longer changes.
    absl::Status captured = capture->Step(step, grad);
    if (absl::Status s = client->FinishStep(); !s.ok()) return s;
    if (!captured.ok()) return captured;
    if (delta_step) {
      absl::Span<const float> after = client->weights();
      for (size_t i = 0; i < before.size(); ++i) {
        before[i] = after[i] - before[i];
      }
      if (absl::Status s = deltas->Step(step, before); !s.ok()) return s;
    }
    result.last_loss = *loss;
    if (own_count) ++own;
    after_step(t0, step,
               own_count ? own : static_cast<int64_t>(client->step()), compute,
               gradient_norm(step));
  }
  result.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (leaving()) {
    SaveWorkerState(o, *client, log, /*last=*/true);  // it may come back
    absl::StatusOr<uint64_t> left = client->Leave();
    if (!left.ok()) return left.status();
    result.left_at_step = *left;
    return result;
  }
  if (absl::Status s =
          capture->Finish(o.capture_file, "gradients", log, worker_id);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = deltas->Finish(o.capture_deltas_file, "weight deltas",
                                      log, worker_id);
      !s.ok()) {
    return s;
  }
  evaluate(per_epoch > 0 ? (total + per_epoch - 1) / per_epoch : 0, total);
  result.steps = total;
  result.stats = client->stats();
  return result;
}

}  // namespace pserver
