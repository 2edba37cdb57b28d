// Optimizers that run on one shard's slice of the flat parameter space.
//
// All Adam variants follow DeepSpeed's 1-bit Adam conventions (Tang et al.,
// ICML 2021): no bias correction unless asked for, eps outside the sqrt, and
// AdamW-style decoupled weight decay:
//   m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
//   x -= lr * (m / (sqrt(v) + eps) + wd * x)
// 1-bit Adam runs exactly that for freeze_step rounds, then freezes v. In the
// robust recipe (DESIGN.md) v is floored at the freeze,
//   sqrt(v) >= floor * mean_over_tensor(sqrt(v)),
// and the momentum moves to the preconditioned space, m_D = D m with
// D = 1 / (sqrt(v) + eps), so pushes carry D g and the step is
//   m_D = b1 m_D + (1 - b1) mean(D g) ;  x -= lr * (m_D + wd * x).
// The DeepSpeed-exact mode keeps raw gradients and no floor:
//   m = b1 m + (1 - b1) g ;  x -= lr * (m / (sqrt(v) + eps) + wd * x).
#ifndef PSERVER_SERVER_OPTIMIZER_H_
#define PSERVER_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

enum class OptimizerKind { kOneBitAdam, kAdam, kSgd };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kOneBitAdam;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled for Adam variants, L2 for SGD
  // Adam's bias correction (off in DeepSpeed's convention). For onebit_adam
  // it applies in warmup, and the moments are frozen bias-corrected.
  bool bias_correction = false;
  float momentum = 0.9f;         // sgd only
  // onebit_adam only.
  uint64_t freeze_step = 100;     // rounds of plain Adam before the freeze
  float variance_floor = 0.1f;    // fraction of the per-tensor mean sqrt(v)
  bool preconditioned = true;     // compress D g (robust) or g (DeepSpeed)
};

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);
std::string OptimizerName(OptimizerKind kind);
// INVALID_ARGUMENT naming the field for out-of-range hyper-parameters.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& c);

// A contiguous range of the shard that belongs to one tensor; per-tensor
// rules (the variance floor) use these.
struct LocalSegment {
  uint64_t begin = 0;  // shard-local offsets
  uint64_t end = 0;
};

// Thread-compatible: the caller serialises calls. Step() may use a second
// thread internally for large shards.
class Optimizer {
 public:
  // `segments` tile [0, n) in order.
  Optimizer(const OptimizerConfig& config, uint64_t n,
            std::vector<LocalSegment> segments);

  const OptimizerConfig& config() const { return config_; }
  void set_lr(float lr) { config_.lr = lr; }

  // One round: x is updated in place from the mean gradient (in the space
  // expected_space() names). Advances step() by one. Returns the L2 norm of
  // the change to x.
  double Step(absl::Span<const float> mean_grad, absl::Span<float> x);

  uint64_t step() const { return step_; }
  // The stage the *next* Step() runs in.
  v1::OptimizerStage stage() const;
  bool frozen() const { return frozen_; }
  // What pushes for the next Step() must carry.
  v1::GradientSpace expected_space() const;

  // The frozen (floored) v; empty before the freeze.
  absl::Span<const float> frozen_variance() const {
    return frozen_ ? absl::MakeConstSpan(v_) : absl::Span<const float>();
  }
  absl::Span<const float> m() const { return m_; }
  absl::Span<const float> v() const { return v_; }

  // Restores state (checkpoints, tests). REQUIRES sizes equal n or empty v.
  // The restored moments count as data for the freeze.
  void RestoreState(uint64_t step, bool frozen, std::vector<float> m,
                    std::vector<float> v);

  // Moves the step counter forward to `step` without updating anything
  // (a shard that lost rounds in a crash catches up with its workers). If
  // that crosses the freeze and this state has seen at least one round, v is
  // frozen now; a state that has seen none (fresh weights) starts its warmup
  // over: it freezes freeze_step rounds later.
  void FastForward(uint64_t step);
  // The step at which v freezes (onebit_adam), or 0.
  uint64_t freeze_at() const {
    return config_.kind == OptimizerKind::kOneBitAdam ? freeze_at_ : 0;
  }

 private:
  void Freeze();
  // Returns the squared L2 norm of the change to x[begin, end).
  double StepRange(uint64_t begin, uint64_t end, absl::Span<const float> g,
                   absl::Span<float> x);

  OptimizerConfig config_;
  uint64_t n_;
  std::vector<LocalSegment> segments_;
  std::vector<float> m_;
  std::vector<float> v_;  // empty for sgd
  uint64_t step_ = 0;
  uint64_t rounds_run_ = 0;  // Step() calls on this state, incl. restored
  uint64_t freeze_at_ = 0;
  bool frozen_ = false;
};

// Runs fn(begin, end) over [0, n) split across up to two threads when n is
// large enough to pay for the second thread.
void ParallelChunks(uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn);

}  // namespace pserver

#endif  // PSERVER_SERVER_OPTIMIZER_H_
