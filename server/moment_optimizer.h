// Adam, 1-bit Adam and SGD with momentum: the optimizers that keep
// per-parameter moments (formulas in server/optimizer.h).
#ifndef PSERVER_SERVER_MOMENT_OPTIMIZER_H_
#define PSERVER_SERVER_MOMENT_OPTIMIZER_H_

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "server/optimizer.h"

namespace pserver {

// Thread-compatible: the caller serialises calls; Step() uses the pool for
// large shards.
class MomentOptimizer final : public Optimizer {
 public:
  // `segments` tile [0, n) in order.
  // Large shards run their loops on `pool` (null: ThreadPool::Default()).
  MomentOptimizer(const OptimizerConfig& config, uint64_t n,
                  std::vector<LocalSegment> segments,
                  ThreadPool* pool = nullptr);

  const OptimizerConfig& config() const { return config_; }
  void set_lr(float lr) { config_.lr = lr; }

  // One round: x is updated in place from the mean gradient (in the space
  // expected_space() names). Advances step() by one. Returns the L2 norm of
  // the change to x.
  double Step(absl::Span<const float> mean_grad, absl::Span<float> x) override;
  void SetHyper(std::vector<GroupHyper> groups) override {
    hyper_ = std::move(groups);
  }
  void SkipNext(std::vector<bool> skip) override { skip_ = std::move(skip); }
  absl::Span<const uint64_t> idle_rounds() const override { return idle_; }
  absl::Status RestoreIdleRounds(std::vector<uint64_t> idle) override;

  uint64_t step() const override { return step_; }
  // The stage the *next* Step() runs in.
  v1::OptimizerStage stage() const override;
  bool frozen() const override { return frozen_; }
  // What pushes for the next Step() must carry.
  v1::GradientSpace expected_space() const override;

  // The frozen (floored) v; empty before the freeze.
  absl::Span<const float> frozen_variance() const override {
    return frozen_ ? absl::MakeConstSpan(v_) : absl::Span<const float>();
  }
  absl::Span<const float> m() const override { return m_; }
  absl::Span<const float> v() const override { return v_; }

  // Restores state (checkpoints, tests). REQUIRES sizes equal n or empty v.
  // The restored moments count as data for the freeze.
  void RestoreState(uint64_t step, bool frozen, std::vector<float> m,
                    std::vector<float> v, uint64_t freeze_at) override;

  // Moves the step counter forward to `step` without updating anything
  // (a shard that lost rounds in a crash catches up with its workers). If
  // that crosses the freeze and this state has seen at least one round, v is
  // frozen now; a state that has seen none (fresh weights) starts its warmup
  // over: it freezes freeze_step rounds later.
  void FastForward(uint64_t step) override;
  // The step at which v freezes (onebit_adam), or 0.
  uint64_t freeze_at() const override {
    return config_.kind == OptimizerKind::kOneBitAdam ? freeze_at_ : 0;
  }

 private:
  void Freeze();
  // At the freeze: v of the tensors that never had a gradient.
  void FillUnseenVariance();
  // The compression stage's step scale for the coming step
  // (OptimizerConfig::variance_growth; 1 when off or not frozen). v counts
  // as frozen after freeze_at_ rounds of Adam.
  float GrowthScale() const;
  // Returns the squared L2 norm of the change to x[begin, end), one
  // segment's piece or less, stepped with `h`. `grow` is GrowthScale(),
  // taken once per step.
  double StepRange(uint64_t begin, uint64_t end, absl::Span<const float> g,
                   absl::Span<float> x, float grow, const GroupHyper& h,
                   uint64_t idle);
  // Adam's bias corrections for a segment skipped in `idle` rounds, at
  // round t of the optimizer (its own round t - idle).
  void Corrections(uint64_t t, uint64_t idle, float* mc, float* vc) const;
  // StepRange over [begin, end), any segments, each with its group's values;
  // buffers take the mean pushed value.
  double StepSegments(uint64_t begin, uint64_t end, absl::Span<const float> g,
                      absl::Span<float> x, float grow);

  OptimizerConfig config_;
  ThreadPool* const pool_;
  uint64_t n_;
  std::vector<LocalSegment> segments_;  // tile [0, n_), in order
  std::vector<GroupHyper> hyper_;        // SetHyper's values
  std::vector<bool> skip_;               // SkipNext's, for one Step()
  std::vector<uint64_t> idle_;           // per segment; empty: all 0
  std::vector<float> m_;
  std::vector<float> v_;  // empty for sgd
  uint64_t step_ = 0;
  uint64_t rounds_run_ = 0;  // Step() calls on this state, incl. restored
  uint64_t freeze_at_ = 0;
  bool frozen_ = false;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_MOMENT_OPTIMIZER_H_
