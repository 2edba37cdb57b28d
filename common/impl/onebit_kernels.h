// Private to common/impl: the onebit encode and decode kernels (scalar and
// AVX2, chosen at run time; onebit_kernels.cc), behind the codec of
// onebit.cc. Payload layout: block scales (fp32), then sign bits LSB-first.
#ifndef PSERVER_COMMON_IMPL_ONEBIT_KERNELS_H_
#define PSERVER_COMMON_IMPL_ONEBIT_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/impl/codecs.h"

namespace pserver {
namespace impl {

struct OneBitLayout {
  uint64_t block = 1;
  uint64_t blocks = 0;
  uint64_t sign_bytes = 0;
};

inline OneBitLayout MakeOneBitLayout(uint64_t n, uint32_t block_size) {
  OneBitLayout l;
  l.block = EffectiveBlock(n, block_size);
  l.blocks = n == 0 ? 0 : CeilDiv(n, l.block);
  l.sign_bytes = CeilDiv(n, 8);
  return l;
}

// The input of one encode call: u = g (e_in null) or g + decay * e_in (the
// product rounded to fp32 first). e_out, if set, receives u - decode(u);
// kernels may keep u there between their sum pass and their sign pass.
// e_out may be e_in itself (updated in place: each element is read before
// it is written), but then a refused call (a non-finite u) leaves e_in
// partly updated and its message may name a wrong value. e_sq, if set (with
// e_out), receives the sum of the squares of e_out: per block in 8 float
// lanes (element j of a block in lane j % 8, the lanes in ReduceLanes'
// tree), the blocks' sums added in double.
struct OneBitInput {
  const float* g;
  const float* e_in;
  float decay;
  float* e_out;
  bool l2;  // scale = sqrt(mean u^2) instead of mean |u|
  double* e_sq = nullptr;
};

// Writes the scales and sign bits of the n elements of a (signs must be
// zero on entry) and, with error feedback, the residuals. INVALID_ARGUMENT
// names the first non-finite u_i; then the outputs are unspecified.
absl::Status OneBitEncode(const OneBitInput& a, uint64_t n,
                          const OneBitLayout& l, uint8_t* scales,
                          uint8_t* signs);

// acc[i] += alpha * decode(element i). REQUIRES: the payload was validated.
void OneBitAccumulate(const uint8_t* scales, const uint8_t* signs, uint64_t n,
                      const OneBitLayout& l, float alpha, float* acc);

// out[i] = base[i] + alpha * decode(element i), bit for bit a copy of base
// followed by OneBitAccumulate, in one pass. base may equal out (otherwise
// they must not overlap). REQUIRES: the payload was validated.
void OneBitAddTo(const uint8_t* scales, const uint8_t* signs, uint64_t n,
                 const OneBitLayout& l, float alpha, const float* base,
                 float* out);

// out[i] = 0.0f + alpha * decode(element i): bit for bit a zero-filled out
// followed by OneBitAccumulate, in one pass that does not read out.
// REQUIRES: the payload was validated.
void OneBitAssign(const uint8_t* scales, const uint8_t* signs, uint64_t n,
                  const OneBitLayout& l, float alpha, float* out);

}  // namespace impl
}  // namespace pserver

#endif  // PSERVER_COMMON_IMPL_ONEBIT_KERNELS_H_
