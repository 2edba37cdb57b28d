// What the training loop (worker/trainer.h) trains: a model's layout and
// initial weights, a gradient per step, and an evaluation if it has a test
// set. Two workloads: the reference MLP on Fashion-MNIST and a synthetic
// model of any size with seeded random gradients. The loop is the same for
// both (registration, residual state file, metrics, progress).
#ifndef PSERVER_WORKER_WORKLOADS_H_
#define PSERVER_WORKER_WORKLOADS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pserver/v1/parameter_server.pb.h"
#include "worker/mlp.h"
#include "worker/trainer.h"

namespace pserver {

// Thread-compatible: one training loop drives one workload.
// Called with [begin, end) of the gradient once it holds its final values.
using GradientReadyFn = std::function<void(uint64_t begin, uint64_t end)>;

class Workload {
 public:
  virtual ~Workload() = default;

  virtual const v1::ModelLayout& layout() const = 0;
  virtual std::vector<float> InitialWeights() const = 0;
  // Steps of the whole run.
  virtual int64_t total_steps() const = 0;
  // Steps per pass over the data; 0 for a workload without data.
  virtual int64_t steps_per_epoch() const = 0;
  // Writes the gradient at `weights` for `step` into `grad` and returns the
  // minibatch loss (0 for a model without one). INTERNAL when the loss is
  // not finite. REQUIRES: weights.size() == grad.size() == parameters.
  // `ready(begin, end)`, when set, is called as soon as grad[begin, end)
  // holds its final values (per layer, in backward order), so the caller
  // can push those while the rest is computed (Client::GradientReady).
  virtual absl::StatusOr<double> Gradient(int64_t step,
                                          absl::Span<const float> weights,
                                          absl::Span<float> grad,
                                          const GradientReadyFn& ready) = 0;
  absl::StatusOr<double> Gradient(int64_t step,
                                  absl::Span<const float> weights,
                                  absl::Span<float> grad) {
    return Gradient(step, weights, grad, nullptr);
  }
  // Loss and accuracy on the test set; nullopt without one.
  virtual std::optional<EvalResult> Evaluate(
      absl::Span<const float> weights) = 0;
};

// The MLP of options.hidden on the Fashion-MNIST files in options.data_dir,
// this worker's share of each minibatch (worker/batcher.h).
absl::StatusOr<std::unique_ptr<Workload>> MakeMlpWorkload(
    const TrainerOptions& options, uint32_t worker_id, uint32_t num_workers);

// options.synthetic_params parameters in options.synthetic_tensors equal
// tensors; gradients are a seeded noise buffer read from a step-dependent
// rotation (different per step and worker at memcpy cost). 100 steps unless
// options.steps is set.
absl::StatusOr<std::unique_ptr<Workload>> MakeSyntheticWorkload(
    const TrainerOptions& options, uint32_t worker_id);

}  // namespace pserver

#endif  // PSERVER_WORKER_WORKLOADS_H_
