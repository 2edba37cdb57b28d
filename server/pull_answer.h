// A pull's answer: one chunk of a step's weights (delta or snapshot),
// serialized once where it is built and shared, immutable, by every pull of
// that chunk and step (a waiting pull holds a reference, not a copy; the
// transport sends the same bytes, server/pull_answer_bytes.h).
#ifndef PSERVER_SERVER_PULL_ANSWER_H_
#define PSERVER_SERVER_PULL_ANSWER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

struct PullChunk {
  std::string bytes;  // a serialized v1::PullResponse
  v1::Codec codec = v1::CODEC_UNSPECIFIED;
  uint64_t payload_bytes = 0;
  uint64_t num_elements = 0;

  // The response itself (tests and tools; the transport sends `bytes`).
  v1::PullResponse Parse() const {
    v1::PullResponse r;
    r.ParseFromString(bytes);
    return r;
  }
};
using PullAnswer = std::shared_ptr<const PullChunk>;

// Serializes `header` (a PullResponse whose weights are unset) with weights
// = `weights_head` (an EncodedTensor whose payload is unset) carrying
// `payload`: the payload is copied once, into the result, instead of into a
// message and then into its serialization. payload_bytes counts the
// header's later_deltas too.
PullAnswer MakePullAnswer(const v1::PullResponse& header,
                          const v1::EncodedTensor& weights_head,
                          absl::string_view payload);

}  // namespace pserver

#endif  // PSERVER_SERVER_PULL_ANSWER_H_
