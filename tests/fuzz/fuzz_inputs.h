// Input formats of the fuzz targets, shared by the targets and the corpus
// generator (make_corpus.cc) so the committed seeds stay in step with them.
//
// Each format starts with one mode byte. One mode hands the bytes to a
// protobuf parser as they are (the real attack surface); the other builds a
// well-formed message around raw bytes, so the fuzzer reaches the payload
// decoders without first having to discover protobuf framing.
#ifndef PSERVER_TESTS_FUZZ_FUZZ_INPUTS_H_
#define PSERVER_TESTS_FUZZ_FUZZ_INPUTS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace pserver {
namespace fuzz {

// ---- codec_fuzzer ---------------------------------------------------------
// byte 0: kCodecProto: bytes 1.. are a serialized pserver.v1.EncodedTensor.
//         kCodecRaw:   bytes 1..8 are a RawTensorHeader, the rest is the
//                      payload.
inline constexpr uint8_t kCodecProto = 0;
inline constexpr uint8_t kCodecRaw = 1;

// 8 bytes, little-endian:
//   [0] codec: value % 10 as pserver.v1.Codec (0 = CODEC_UNSPECIFIED)
//   [1] flags: bits 0-1 value_format, 2-3 range, 4 unbiased, 5-6 scale_mode
//   [2..3] num_elements   [4..5] block_size
//   [6] bits; for CODEC_BLOCK_TOPK (which reads no bits) the row_length
//   [7] k; 0xFF means "as many values as the payload holds" (randomk)
inline constexpr size_t kRawTensorHeaderBytes = 8;

// Decoding allocates num_elements floats: tensors claiming more than this
// are only validated (which must answer from sizes alone, allocation-free).
inline constexpr uint64_t kMaxDecodeElements = uint64_t{1} << 20;

// ---- shard_fuzzer ---------------------------------------------------------
// A sequence of at most kMaxShardOps records: [op u8][length u16 LE][body].
// A short last record takes what is left. The shard starts registered (both
// workers) with the layout below.
enum ShardOp : uint8_t {
  kOpRegister = 0,    // body: serialized RegisterRequest
  kOpPush = 1,        // body: serialized PushRequest
  kOpPull = 2,        // body: serialized PullRequest
  // body: [worker][step delta i8][codec][space][bits][block] + payload; the
  // gradient claims exactly the shard's element count.
  kOpPushRaw = 3,
  // body: [worker][step delta i8][codec][space][seed]: a well-formed push of
  // a deterministic gradient, so rounds (and the freeze) are cheap to reach.
  kOpPushValid = 4,
  kOpReset = 5,       // a fresh, unregistered shard replaces the current one
                      // (body[0] % 3: bsp, ssp with s = 0, async)
  kOpFrozenVariance = 6,  // body: [worker]
  // body: [worker][step delta i8][replica delta i8][want_snapshot]
  kOpPullRaw = 7,
  kShardOpCount = 8,
};
inline constexpr int kMaxShardOps = 64;
inline constexpr uint32_t kShardWorkers = 2;
inline constexpr uint64_t kShardFreezeStep = 2;
// "w" [4, 64] then "b" [64].
inline constexpr uint64_t kShardElements = 320;

inline void AppendRecord(std::string* out, uint8_t op, absl::string_view body) {
  out->push_back(static_cast<char>(op));
  out->push_back(static_cast<char>(body.size() & 0xFF));
  out->push_back(static_cast<char>((body.size() >> 8) & 0xFF));
  out->append(body.data(), body.size());
}

// ---- checkpoint_fuzzer ----------------------------------------------------
// byte 0 flags: kCkptSeal: append the Checksum64 of bytes 1.. (so the parser
// gets past its checksum gate); kCkptLoad: if it parses, also load it through
// Shard::Create from a checkpoint folder and run a pull and a round on it;
// kCkptOneBitPull: that shard's pull codec is onebit instead of fp32.
inline constexpr uint8_t kCkptSeal = 1;
inline constexpr uint8_t kCkptLoad = 2;
inline constexpr uint8_t kCkptOneBitPull = 4;
// Loading through a shard pushes once per worker: only for small counts.
inline constexpr uint32_t kMaxLoadWorkers = 8;

}  // namespace fuzz
}  // namespace pserver

#endif  // PSERVER_TESTS_FUZZ_FUZZ_INPUTS_H_
