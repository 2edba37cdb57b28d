// A fast, stable 64-bit checksum of byte strings, used to verify that a
// worker's replica equals the shard's (PullResponse.replica_checksum) and to
// compare whole shard states in tests. Not cryptographic. The value depends
// only on the bytes, never on the machine, process or build.
#ifndef PSERVER_COMMON_CHECKSUM_H_
#define PSERVER_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace pserver {

// Thread-compatible incremental hasher: Update() with consecutive pieces gives
// the same Finish() as one Update() with their concatenation.
class Checksum64 {
 public:
  Checksum64();
  void Update(const void* data, size_t size);
  uint64_t Finish() const;

 private:
  void Block(const unsigned char* p);
  uint64_t lanes_[4];
  unsigned char tail_[32];
  size_t tail_size_ = 0;
  uint64_t total_ = 0;
};

inline uint64_t ChecksumOf(absl::Span<const float> v) {
  Checksum64 h;
  h.Update(v.data(), v.size() * sizeof(float));
  return h.Finish();
}

}  // namespace pserver

#endif  // PSERVER_COMMON_CHECKSUM_H_
