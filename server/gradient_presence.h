// Which parameter tensors of a shard got a gradient in a round: a worker
// without one for a tensor (torch's `.grad` None) sends it as
// CODEC_NO_GRADIENT (codec.proto), and a tensor no summed push of the round
// had a gradient for is left out of the optimizer's step, as torch.optim
// leaves a parameter without a gradient untouched.
//
// Usage (the shard, under its mutex):
//   presence.Reset(segments);                      // a model was installed
//   presence.Mark(chunk_begin, push.gradient());   // each summed push
//   if (push.overflow()) presence.MarkOverflow(w);  // a scaler's overflow
//   std::vector<bool> skip = presence.Skipped();   // the round completes
//   presence.Clear();                              // the next round
#ifndef PSERVER_SERVER_GRADIENT_PRESENCE_H_
#define PSERVER_SERVER_GRADIENT_PRESENCE_H_

#include <cstdint>
#include <vector>

#include "pserver/v1/codec.pb.h"
#include "server/optimizer.h"

namespace pserver {

// Thread-compatible.
class GradientPresence {
 public:
  // The shard's tensor pieces (the optimizer's segments, in order); nothing
  // is marked.
  void Reset(const std::vector<LocalSegment>& segments);
  // A summed push of the elements [offset, offset + t.num_elements()) of
  // the slice: every segment that a piece of t other than
  // CODEC_NO_GRADIENT overlaps has a gradient this round.
  void Mark(uint64_t offset, const v1::EncodedTensor& t);
  // Per segment: true for a parameter segment no push marked (buffers are
  // never skipped). Empty when every segment has a gradient, the common
  // case, so a caller can test it cheaply.
  std::vector<bool> Skipped() const;
  // A summed push of worker `w` reported an overflow (PushRequest.overflow):
  // Skipped() names every parameter segment.
  void MarkOverflow(uint32_t w);
  // Whether a push of this round reported an overflow, and the first
  // worker that did.
  bool overflow() const { return overflow_; }
  uint32_t overflow_worker() const { return overflow_worker_; }
  // A new round: nothing marked.
  void Clear();

 private:
  void MarkRange(uint64_t begin, uint64_t end);

  std::vector<uint64_t> ends_;  // segment i ends at ends_[i]
  std::vector<bool> buffer_;
  std::vector<bool> marked_;
  uint64_t unmarked_ = 0;  // parameter segments not marked yet
  bool overflow_ = false;
  uint32_t overflow_worker_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_SERVER_GRADIENT_PRESENCE_H_
