#include "common/checksum.h"

#include <cstring>

namespace pserver {
namespace {

// Four independent multiply-rotate lanes over 32-byte blocks (the structure
// of xxHash64, constants from it), so the loop runs near memory bandwidth.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64)
  return v;
}
inline uint64_t Round(uint64_t acc, uint64_t in) {
  return Rotl(acc + in * kP2, 31) * kP1;
}

}  // namespace

Checksum64::Checksum64()
    : lanes_{kP1 + kP2, kP2, 0, 0 - kP1} {}

void Checksum64::Block(const unsigned char* p) {
  lanes_[0] = Round(lanes_[0], Load64(p));
  lanes_[1] = Round(lanes_[1], Load64(p + 8));
  lanes_[2] = Round(lanes_[2], Load64(p + 16));
  lanes_[3] = Round(lanes_[3], Load64(p + 24));
}

void Checksum64::Update(const void* data, size_t size) {
  if (size == 0) return;  // data may be null (an empty vector's data())
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (tail_size_ > 0) {
    size_t take = 32 - tail_size_;
    if (take > size) take = size;
    std::memcpy(tail_ + tail_size_, p, take);
    tail_size_ += take;
    p += take;
    size -= take;
    if (tail_size_ < 32) return;
    Block(tail_);
    tail_size_ = 0;
  }
  while (size >= 32) {
    Block(p);
    p += 32;
    size -= 32;
  }
  std::memcpy(tail_, p, size);
  tail_size_ = size;
}

uint64_t Checksum64::Finish() const {
  uint64_t h = Rotl(lanes_[0], 1) + Rotl(lanes_[1], 7) + Rotl(lanes_[2], 12) +
               Rotl(lanes_[3], 18);
  for (uint64_t lane : lanes_) {
    h ^= Round(0, lane);
    h = h * kP1 + kP4;
  }
  h += total_;
  size_t i = 0;
  for (; i + 8 <= tail_size_; i += 8) {
    h ^= Round(0, Load64(tail_ + i));
    h = Rotl(h, 27) * kP1 + kP4;
  }
  for (; i < tail_size_; ++i) {
    h ^= tail_[i] * kP3;
    h = Rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace pserver
