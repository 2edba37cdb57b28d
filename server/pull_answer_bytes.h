// The wire bytes of a pull answer without a copy: a grpc::ByteBuffer whose
// one slice points at the answer's serialized bytes (server/pull_answer.h)
// and keeps the answer alive. Every pull of one chunk and step sends the
// same bytes, so N waiting pulls cost one serialization, not N (issue 9,
// hole 10a: 40 waiting pulls on an 8 MiB shard once cost 336 MiB).
#ifndef PSERVER_SERVER_PULL_ANSWER_BYTES_H_
#define PSERVER_SERVER_PULL_ANSWER_BYTES_H_

#include "grpcpp/support/byte_buffer.h"
#include "server/pull_answer.h"

namespace pserver {

// REQUIRES: answer != nullptr.
grpc::ByteBuffer PullAnswerBuffer(PullAnswer answer);

}  // namespace pserver

#endif  // PSERVER_SERVER_PULL_ANSWER_BYTES_H_
