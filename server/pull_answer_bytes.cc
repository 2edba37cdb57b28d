#include "server/pull_answer_bytes.h"

#include <memory>
#include <utility>

#include "grpcpp/support/slice.h"

namespace pserver {
namespace {

// The slice owns one reference to the answer; gRPC calls this when the last
// slice reference (across every response that shares it) is gone.
void ReleaseAnswer(void* user_data) { delete static_cast<PullAnswer*>(user_data); }

}  // namespace

grpc::ByteBuffer PullAnswerBuffer(PullAnswer answer) {
  const std::string& bytes = answer->bytes;
  auto* owner = new PullAnswer(std::move(answer));
  // The slice points at the answer's bytes without copying them.
  grpc::Slice slice(const_cast<char*>(bytes.data()), bytes.size(),
                    &ReleaseAnswer, owner);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace pserver
