// The worker's training loop, one for every workload (worker/workloads.h:
// the reference MLP on Fashion-MNIST, or a synthetic model of any size),
// driven through a Client: register, restore the error-feedback residuals
// from the state file, step until the last step, save the residuals every
// state_every steps and at the end, evaluate each epoch when the workload has
// a test set.
#ifndef PSERVER_WORKER_TRAINER_H_
#define PSERVER_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tune/gradient_file.h"
#include "worker/client.h"
#include "worker/inner_adam.h"
#include "worker/metrics.h"
#include "worker/mlp.h"

namespace pserver {

struct TrainerOptions {
  std::string model = "mlp";  // "mlp" or "synthetic"
  std::vector<int> hidden = {256, 128};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 5;
  int64_t steps = 0;  // > 0: stop after this many steps instead
  int batch_size = 32;
  uint64_t seed = 1;  // model initialisation and data order
  InitScheme init = InitScheme::kPyTorch;  // the MLP's initial weights
  int64_t train_subset = 0;  // > 0: use only the first N training examples
  int64_t test_subset = 0;   // > 0: evaluate on the first N test examples
  // Synthetic model: this many parameters in this many equal tensors, with
  // seeded random gradients.
  uint64_t synthetic_params = uint64_t{1} << 20;
  int synthetic_tensors = 4;
  double log_interval_seconds = 5;
  bool progress_bar = false;  // redraw one line instead of printing lines
  bool evaluate_each_epoch = true;
  // > 0: also evaluate every this many steps.
  int64_t eval_every_steps = 0;
  // Error-feedback residuals on disk (empty: none): loaded after Register if
  // present, saved every state_every steps and at the end.
  std::string state_file;
  int64_t state_every = 100;
  // Local steps (DiLoCo): each round, this many steps of Adam (`inner`) on
  // the worker's own copy of the weights, then one push of the weight
  // change (the replica minus the local weights) that the shards average
  // and apply with their optimizer (sgd --nesterov: the outer optimizer).
  // 1: a push per step, the shards' optimizer on the gradients (the
  // default). `steps`/`epochs` count local steps; the shards count rounds.
  int local_steps = 1;
  InnerAdamOptions inner;
  // Added to every gradient's compute time (a sleep after it): makes this
  // worker a straggler on purpose, for benchmarks and tests of rounds that
  // wait for the slowest worker.
  absl::Duration compute_delay = absl::ZeroDuration();
  // Gradient capture (tune/gradient_file.h): the raw minibatch gradient of
  // every step in capture_steps (local steps count with local_steps > 1), as
  // the model computed it, before momentum, error feedback or compression,
  // is appended to capture_file. Empty: no capture. REQUIRES: capture_steps
  // is set when capture_file is.
  std::string capture_file;
  std::optional<StepRanges> capture_steps;
  // Weight-delta capture, same format and steps: the change of this
  // worker's replica over each step in capture_steps (the pulled update, as
  // the pull codec decoded it), for pserver_tune --deltas. Empty: none.
  // REQUIRES: capture_steps is set when it is; local_steps == 1.
  std::string capture_deltas_file;
  // A planned leave (a spot notice): when this is set and becomes true, the
  // next round boundary saves the state file, takes the worker out of the
  // rounds on every shard (Client::Leave: they go on without it at once)
  // and ends the run there, without the final evaluation. Null: never.
  const std::atomic<bool>* leave_requested = nullptr;
};

inline constexpr int kMaxLocalSteps = 100000;

// One step as this worker ran it: wall time from the gradient's start to the
// next step's weights (compute, push, pull), and the encoded payload bytes it
// pushed and pulled.
struct StepRecord {
  double seconds = 0;
  uint64_t push_bytes = 0;
  uint64_t pull_bytes = 0;
  uint64_t minor_faults = 0;  // the whole process's, during the step
  double cpu_seconds = 0;     // the whole process's, during the step
};

// One evaluation on the test set: after which step, when (seconds since
// training started) and the accuracy.
struct Evaluation {
  int64_t step = 0;
  double seconds = 0;
  double accuracy = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double wall_seconds = 0;
  double last_loss = 0;
  double test_accuracy = -1;  // -1 for a workload without a test set
  double test_loss = 0;
  ClientStats stats;  // the final weights are the client's weights()
  std::vector<StepRecord> step_log;  // one per step run here, in order
  // Conditions worker/diagnostics.h reported, by kind name.
  std::map<std::string, int64_t> diagnostics;
  double communication_share = 0;  // its moving average at the end
  // Each evaluation, in order (per epoch with evaluate_each_epoch, and the
  // final one).
  std::vector<Evaluation> evaluations;
  // The run ended on leave_requested: the shards' step it left at (steps,
  // stats and the final evaluation are then left unset).
  std::optional<uint64_t> left_at_step;
};

// Registers with the shards (the model's initial weights from options.seed)
// and trains. Log lines go to `log` (may be null). `metrics` may be null
// (then nothing is exported). Errors from the data, the model or the shards
// end the run.
absl::StatusOr<TrainResult> RunTraining(const TrainerOptions& options,
                                        Client* client,
                                        WorkerMetrics* metrics, FILE* log,
                                        uint32_t worker_id,
                                        uint32_t num_workers);

}  // namespace pserver

#endif  // PSERVER_WORKER_TRAINER_H_
