// The wire bytes of pull answers, serialized once per shared answer. The
// shard answers every pull of a step with the same immutable PullResponse
// (server/pull_waiters.h); serializing it once per pull would give each
// waiting pull its own copy of a snapshot (issue 9, hole 10a: 40 waiting
// pulls on an 8 MiB shard cost 336 MiB when the round completed). Here every
// pull of one answer gets a grpc::ByteBuffer over the same refcounted bytes,
// so the memory of N waiting pulls is one serialization, not N.
#ifndef PSERVER_SERVER_PULL_ANSWER_BYTES_H_
#define PSERVER_SERVER_PULL_ANSWER_BYTES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/pull_waiters.h"

namespace pserver {

// Thread-safe.
class PullAnswerBytes {
 public:
  // A buffer holding `answer` serialized; every call for the same answer
  // object shares one copy of the bytes while any such buffer is alive. The
  // bytes are freed when the last buffer that refers to them is (this class
  // keeps only weak references). REQUIRES: answer != nullptr.
  grpc::ByteBuffer Get(const PullAnswer& answer) ABSL_LOCKS_EXCLUDED(mu_);

  // Serializations alive now (for tests: the sharing is observable).
  int live_serializations() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    // The answer's address is only compared while `answer` is not expired:
    // a live object's address is unique.
    const v1::PullResponse* key = nullptr;
    std::weak_ptr<const v1::PullResponse> answer;
    std::weak_ptr<const std::string> bytes;
  };
  mutable absl::Mutex mu_;
  // A step has at most two answers (delta and snapshot); entries whose
  // answer or bytes are gone are dropped on each call.
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_SERVER_PULL_ANSWER_BYTES_H_
