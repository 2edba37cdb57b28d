#include "server/pull_answer.h"

#include <utility>

#include "common/codec.h"

namespace pserver {
namespace {

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Wire type 2 (length-delimited) tag of field `number`.
uint64_t BytesTag(uint32_t number) { return (uint64_t{number} << 3) | 2; }

}  // namespace

PullAnswer MakePullAnswer(const v1::PullResponse& header,
                          const v1::EncodedTensor& weights_head,
                          absl::string_view payload) {
  auto answer = std::make_shared<PullChunk>();
  answer->codec = weights_head.codec();
  // A segmented delta's payloads are inside its head.
  answer->payload_bytes = payload.size() + PayloadBytes(weights_head);
  for (const v1::EncodedTensor& d : header.later_deltas()) {
    answer->payload_bytes += PayloadBytes(d);
  }
  answer->num_elements = weights_head.num_elements();
  // Fields in number order, as protobuf writes them: those before weights
  // (3), weights, those after.
  v1::PullResponse before, after;
  before.set_step(header.step());
  before.set_kind(header.kind());
  after = header;
  after.clear_step();
  after.clear_kind();
  after.clear_weights();
  const std::string head = before.SerializeAsString();
  const std::string tail = after.SerializeAsString();
  const std::string tensor_head = weights_head.SerializeAsString();
  // EncodedTensor.payload is field 4; PullResponse.weights is field 3.
  // proto3 leaves an empty payload out.
  const uint64_t payload_field =
      payload.empty() ? 0
                      : VarintSize(BytesTag(4)) + VarintSize(payload.size()) +
                            payload.size();
  const uint64_t tensor_size = tensor_head.size() + payload_field;
  std::string& out = answer->bytes;
  out.reserve(head.size() + VarintSize(BytesTag(3)) + VarintSize(tensor_size) +
              tensor_size + tail.size());
  out.append(head);
  PutVarint(BytesTag(3), &out);
  PutVarint(tensor_size, &out);
  out.append(tensor_head);
  if (!payload.empty()) {
    PutVarint(BytesTag(4), &out);
    PutVarint(payload.size(), &out);
    out.append(payload.data(), payload.size());
  }
  out.append(tail);
  return answer;
}

}  // namespace pserver
