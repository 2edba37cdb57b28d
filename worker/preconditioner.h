// 1-bit Adam's frozen preconditioner for one shard's slice (Tang et al.,
// "1-bit Adam", ICML 2021): after the freeze the shard's variance v stops
// changing, so the worker can compress D ⊙ g with D = 1 / (sqrt(v) + eps),
// which evens out the coordinates' scales before 1-bit quantisation
// (--onebit_mode=preconditioned). Fetched once per shard, when it enters
// the compression stage.
#ifndef PSERVER_WORKER_PRECONDITIONER_H_
#define PSERVER_WORKER_PRECONDITIONER_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pserver {

// Thread-compatible (Apply writes a scratch buffer).
class Preconditioner {
 public:
  // D = 1 / (sqrt(v) + eps) from a shard's frozen variance `v` (its memory
  // becomes D's; the client decodes v from the GetFrozenVariance chunks).
  // INVALID_ARGUMENT naming the element when D is not finite (negative or
  // non-finite v, eps <= 0 with v = 0).
  static absl::StatusOr<Preconditioner> FromVariance(std::vector<float> v,
                                                     float eps);

  size_t size() const { return d_.size(); }
  // D[offset, offset + g.size()) ⊙ g, in a buffer this object owns (valid
  // until the next Apply; it grows to the largest piece asked for).
  // REQUIRES: offset + g.size() <= size(). With `max_abs`, also its
  // largest |element| (common/norms.h MaxAbs), taken in the same pass.
  absl::Span<const float> Apply(absl::Span<const float> g, size_t offset = 0,
                                double* max_abs = nullptr);
  // v = D ⊙ v. REQUIRES: v.size() == size().
  void ScaleInPlace(absl::Span<float> v) const;

 private:
  std::vector<float> d_;
  std::vector<float> scratch_;  // D ⊙ g of the last piece
};

}  // namespace pserver

#endif  // PSERVER_WORKER_PRECONDITIONER_H_
