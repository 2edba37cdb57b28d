#include "server/pull_answer_bytes.h"

#include <utility>

#include "grpcpp/support/slice.h"

namespace pserver {
namespace {

// The slice owns one reference to the bytes; gRPC calls this when the last
// slice reference (across every response that shares it) is gone.
void ReleaseBytes(void* user_data) {
  delete static_cast<std::shared_ptr<const std::string>*>(user_data);
}

grpc::ByteBuffer BufferOver(std::shared_ptr<const std::string> bytes) {
  const std::string& s = *bytes;
  auto* owner = new std::shared_ptr<const std::string>(std::move(bytes));
  // The slice points at the string's bytes without copying them; copies of
  // the slice (one per response, and the transport's) share one refcount.
  grpc::Slice slice(const_cast<char*>(s.data()), s.size(), &ReleaseBytes,
                    owner);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

grpc::ByteBuffer PullAnswerBytes::Get(const PullAnswer& answer) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<const std::string> bytes;
  std::vector<Entry> kept;
  for (Entry& e : entries_) {
    if (e.answer.expired()) continue;
    std::shared_ptr<const std::string> b = e.bytes.lock();
    if (b == nullptr) continue;
    if (e.key == answer.get()) bytes = b;
    kept.push_back(std::move(e));
  }
  entries_ = std::move(kept);
  if (bytes == nullptr) {
    // Serialized under mu_: a concurrent pull of the same answer would only
    // serialize it a second time.
    bytes = std::make_shared<const std::string>(answer->SerializeAsString());
    entries_.push_back({answer.get(), answer, bytes});
  }
  return BufferOver(std::move(bytes));
}

int PullAnswerBytes::live_serializations() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Entry& e : entries_) n += e.bytes.expired() ? 0 : 1;
  return n;
}

}  // namespace pserver
