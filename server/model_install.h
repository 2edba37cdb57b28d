// A model installed in chunks (RegisterRequest.chunked_weights): the first
// worker to register on a shard without a model becomes the installer and
// sends its initial weights chunk by chunk; the shard takes the model once
// every chunk is in. No message holds a whole slice, so the model size is
// not bounded by the message size.
#ifndef PSERVER_SERVER_MODEL_INSTALL_H_
#define PSERVER_SERVER_MODEL_INSTALL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/chunking.h"
#include "common/layout.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

// Thread-compatible: the shard calls it under its mutex.
class ModelInstall {
 public:
  // An installation by worker `installer` of `layout` (its slots) for a
  // slice of plan.n elements; allocates the slice (zeros).
  ModelInstall(uint32_t installer, const v1::ModelLayout& layout,
               std::vector<TensorSlot> slots, ChunkPlan plan, absl::Time now);

  uint32_t installer() const { return installer_; }
  const v1::ModelLayout& layout() const { return layout_; }
  const std::vector<TensorSlot>& slots() const { return slots_; }
  const ChunkPlan& plan() const { return plan_; }
  uint32_t chunks_in() const { return chunks_in_; }
  bool complete() const { return chunks_in_ == plan_.num_chunks(); }
  // Time since the installer's last call.
  absl::Duration Idle(absl::Time now) const { return now - last_call_; }
  void Touch(absl::Time now) { last_call_ = now; }

  // Takes chunk c: an fp32 tensor of exactly that chunk's length with finite
  // values. A chunk already in is ignored (a retried call). INVALID_ARGUMENT
  // naming weights_chunk or initial_weights otherwise; nothing changes then.
  absl::Status Accept(uint32_t c, const v1::EncodedTensor& weights);
  // The slice. REQUIRES: complete(). Leaves this object empty.
  std::vector<float> TakeWeights() { return std::move(x_); }

 private:
  const uint32_t installer_;
  const v1::ModelLayout layout_;
  const std::vector<TensorSlot> slots_;
  const ChunkPlan plan_;
  std::vector<float> x_;
  std::vector<bool> in_;
  uint32_t chunks_in_ = 0;
  absl::Time last_call_;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_MODEL_INSTALL_H_
