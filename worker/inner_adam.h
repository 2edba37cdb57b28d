// The worker-side optimizer of local-step training (DiLoCo, Douillard et al.
// 2023): each worker runs H steps of Adam on its own copy of the weights,
// then pushes its weight change, which the shards average and apply with an
// outer optimizer (server/optimizer.h, sgd with --nesterov).
//
// Adam as torch.optim.AdamW with its defaults: bias correction, eps outside
// the square root, decoupled weight decay:
//   m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
//   x -= lr * ((m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * x)
// Its moments persist across synchronisations (DiLoCo keeps the inner
// optimizer's state); they are this worker's own and are not checkpointed.
//
// Thread-compatible.
#ifndef PSERVER_WORKER_INNER_ADAM_H_
#define PSERVER_WORKER_INNER_ADAM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pserver {

struct InnerAdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

class InnerAdam {
 public:
  // INVALID_ARGUMENT naming the option when one is out of range.
  static absl::Status Validate(const InnerAdamOptions& o);

  // REQUIRES: Validate(o).ok().
  InnerAdam(const InnerAdamOptions& o, size_t n);

  // One step on `x` with gradient `g`. REQUIRES: both of size n.
  void Step(absl::Span<const float> g, absl::Span<float> x);

  uint64_t steps() const { return t_; }

 private:
  const InnerAdamOptions o_;
  std::vector<float> m_, v_;
  uint64_t t_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_INNER_ADAM_H_
