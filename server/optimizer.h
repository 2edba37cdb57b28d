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
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "pserver/v1/parameter_server.pb.h"
#include "pserver/v1/schedule.pb.h"
#include "server/lr_schedule.h"

namespace pserver {

enum class OptimizerKind { kOneBitAdam, kAdam, kSgd };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kOneBitAdam;
  float lr = 1e-3f;  // the peak of the learning-rate schedule
  // The learning-rate schedule (server/lr_schedule.h), in rounds.
  uint64_t lr_warmup_rounds = 0;
  LrDecay lr_decay = LrDecay::kConstant;
  uint64_t lr_decay_rounds = 0;
  float min_lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled for Adam variants, L2 for SGD
  // Adam's bias correction (torch.optim.Adam's; off in DeepSpeed's
  // convention, which pserver_server keeps for onebit_adam unless told).
  // For onebit_adam it applies in warmup, and the moments are frozen
  // bias-corrected.
  bool bias_correction = false;
  float momentum = 0.9f;         // sgd only
  // sgd only: Nesterov's momentum, x -= lr * (g + momentum * m) after
  // m = momentum * m + g (Sutskever et al. 2013, as torch.optim.SGD's
  // nesterov=True). With local steps (--local_steps on the workers) the mean
  // "gradient" is the workers' averaged weight change and this is DiLoCo's
  // outer optimizer (Douillard et al. 2023: lr 0.7, momentum 0.9).
  bool nesterov = false;
  // onebit_adam only.
  uint64_t freeze_step = 100;     // rounds of plain Adam before the freeze
  float variance_floor = 0.1f;    // fraction of the per-tensor mean sqrt(v)
  // Compression stage: scale the momentum's step at round t by
  // sqrt((1 - b2^T) / (1 - b2^t)), T the freeze round: the growth that
  // plain Adam's uncorrected v, b2 v + (1 - b2) g^2 from 0, would still have
  // if g^2 stayed as it was at the freeze. Without it the frozen v keeps
  // the under-estimate of round T (1 - b2^T: 0.45 at T = 600), so the steps
  // after the freeze stay larger than Adam's. 1 with bias_correction (the
  // frozen v is corrected already).
  bool variance_growth = false;
  bool preconditioned = true;     // compress D g (robust) or g (DeepSpeed)
  // Compression stage: the workers keep the momentum and push it, and m here
  // is only the freeze-time momentum decaying by CompressionBeta1 per round
  // (RegisterResponse.worker_momentum); false: the pushes are gradients.
  bool worker_momentum = false;
  // The momentum's decay in the compression stage (the workers' with
  // worker_momentum, else m here); -1: beta1. A lower one than the
  // warmup's follows the gradient faster once pushes are 1-bit
  // (tests/bench/results/README.md).
  float compression_beta1 = -1.0f;
};

// beta1 in the compression stage: compression_beta1, or beta1 when unset.
inline float CompressionBeta1(const OptimizerConfig& c) {
  return c.compression_beta1 >= 0 ? c.compression_beta1 : c.beta1;
}

// The decay with which the workers keep 1-bit Adam's compression-stage
// momentum (RegisterResponse.worker_momentum; CompressionBeta1), or 0 when
// pushes carry gradients (every other optimizer, --onebit_momentum=server,
// or a decay of 0, where the momentum is the gradient either way).
inline float WorkerMomentumBeta(const OptimizerConfig& c) {
  return c.kind == OptimizerKind::kOneBitAdam && c.worker_momentum
             ? CompressionBeta1(c)
             : 0.0f;
}

// The config's learning-rate schedule.
inline LrSchedule ScheduleOf(const OptimizerConfig& c) {
  return LrSchedule{c.lr, c.lr_warmup_rounds, c.lr_decay, c.lr_decay_rounds,
                    c.min_lr};
}

std::string OptimizerName(OptimizerKind kind);

// A compression schedule file's learning_rate section in place of the
// flags' schedule (and lr, when the file sets it); INVALID_ARGUMENT naming
// the field for an unknown decay (config unchanged). A schedule without
// the section changes nothing.
absl::Status ApplyLearningRateSchedule(const v1::CompressionSchedule& schedule,
                                       OptimizerConfig* config);
// INVALID_ARGUMENT naming the field for out-of-range hyper-parameters.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& c);

// A contiguous range of the shard that belongs to one tensor; per-tensor
// rules (the variance floor, the hyper-parameter group) use these.
struct LocalSegment {
  uint64_t begin = 0;  // shard-local offsets
  uint64_t end = 0;
  uint32_t group = 0;   // the tensor's hyper-parameter group
  // A buffer (v1::TENSOR_KIND_BUFFER): Step sets x to the mean pushed
  // value, leaving the moments alone.
  bool buffer = false;
};

// One hyper-parameter group's values for a round.
struct GroupHyper {
  float lr = 0.0f;
  float weight_decay = 0.0f;  // decoupled for Adam variants, L2 for sgd
};

// What the shard needs of an optimizer: one step on the mean gradient, the
// stage it is in, and its state for checkpoints and the preconditioner.
// Adam, 1-bit Adam and SGD (heavy-ball or Nesterov) are one class
// (server/moment_optimizer.h);
// another optimizer (e.g. an outer optimizer for local steps) is a new
// implementation, not a branch in the shard.
//
// Thread-compatible: the caller serialises calls.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One round: x is updated in place from the mean gradient (in the space
  // expected_space() names). Advances step() by one. Returns the L2 norm of
  // the change to x's parameters (buffers left out).
  virtual double Step(absl::Span<const float> mean_grad,
                      absl::Span<float> x) = 0;
  // The hyper-parameters of the following Step()s, one per group (a
  // segment whose group is past the end takes the config's lr and
  // weight_decay, as every segment does before the first call).
  virtual void SetHyper(std::vector<GroupHyper> groups) = 0;
  // The next Step() leaves the segments with skip[i] set as they are (x,
  // moments, their step count): no push of the round had a gradient for
  // them (server/gradient_presence.h), as torch.optim leaves a parameter
  // whose `.grad` is None. REQUIRES: skip.size() is the segments' count.
  virtual void SkipNext(std::vector<bool> skip) = 0;
  // Per segment, the rounds it was skipped in (empty: none ever), so its
  // own step count, for Adam's bias correction, is step() minus that, as
  // torch.optim counts a parameter's steps.
  virtual absl::Span<const uint64_t> idle_rounds() const = 0;
  // Restores idle_rounds() (checkpoints): INVALID_ARGUMENT, nothing
  // changed, unless empty or one per segment, each <= step().
  virtual absl::Status RestoreIdleRounds(std::vector<uint64_t> idle) = 0;

  virtual uint64_t step() const = 0;
  // The stage the *next* Step() runs in.
  virtual v1::OptimizerStage stage() const = 0;
  virtual bool frozen() const = 0;
  // What pushes for the next Step() must carry.
  virtual v1::GradientSpace expected_space() const = 0;
  // The frozen (floored) v; empty before the freeze or without one.
  virtual absl::Span<const float> frozen_variance() const = 0;
  // The moments, for checkpoints (v is empty for optimizers without one).
  virtual absl::Span<const float> m() const = 0;
  virtual absl::Span<const float> v() const = 0;
  // Restores state (checkpoints, tests). REQUIRES sizes equal n, or an
  // empty v for optimizers without one. `freeze_at` is the saved
  // freeze_at() (0: the configured one), so a warmup that a fast-forward
  // restarted still ends where it would have.
  virtual void RestoreState(uint64_t step, bool frozen, std::vector<float> m,
                            std::vector<float> v, uint64_t freeze_at) = 0;
  // Moves the step counter forward to `step` without updating anything (a
  // shard that lost rounds in a crash catches up with its workers).
  virtual void FastForward(uint64_t step) = 0;
  // The step at which v freezes, or 0 for optimizers that never freeze.
  virtual uint64_t freeze_at() const = 0;
};

class ThreadPool;

// The optimizer `config` names over n parameters; `segments` tile [0, n)
// by tensor. Large shards run its loops on `pool` (null: the default pool).
std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         uint64_t n,
                                         std::vector<LocalSegment> segments,
                                         ThreadPool* pool = nullptr);

// Chunk size below which a second core costs more than it saves.
inline constexpr uint64_t kMinParallelChunk = uint64_t{1} << 16;

}  // namespace pserver

#endif  // PSERVER_SERVER_OPTIMIZER_H_
