// libFuzzer target: every payload decoder (common/impl/) on untrusted bytes.
//
// Input format: tests/fuzz/fuzz_inputs.h. Properties checked, beyond "no
// crash, no out-of-bounds access, no UB" (the sanitizers' job):
//   - Validate answers for any claimed element count without allocating it;
//   - DecodeAccumulate accepts exactly what Validate accepts, and a rejected
//     tensor leaves the accumulator byte-for-byte unchanged (codec.h);
//   - a tensor is rejected for any accumulator length but its own;
//   - ValidateTensor accepts exactly what MakeCodec (params) and Validate
//     accept, and its token decodes bit for bit as Codec::Decode.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "common/codec.h"
#include "common/validated_tensor.h"
#include "pserver/v1/codec.pb.h"
#include "tests/fuzz/fuzz_inputs.h"

namespace pserver {
namespace fuzz {
namespace {

v1::EncodedTensor FromRaw(const uint8_t* data, size_t size) {
  v1::EncodedTensor t;
  const uint8_t* h = data;
  t.set_codec(static_cast<v1::Codec>(h[0] % 10));
  t.set_num_elements(h[2] | (h[3] << 8));
  v1::CodecParams* p = t.mutable_params();
  p->set_value_format(static_cast<v1::ValueFormat>(h[1] & 3));
  p->set_range(static_cast<v1::QuantizeRange>((h[1] >> 2) & 3));
  p->set_unbiased((h[1] >> 4) & 1);
  p->set_scale_mode(static_cast<v1::ScaleMode>((h[1] >> 5) & 3));
  p->set_block_size(h[4] | (h[5] << 8));
  if (t.codec() == v1::CODEC_BLOCK_TOPK) {
    p->set_row_length(h[6]);  // block_topk reads no bits
  } else {
    p->set_bits(h[6]);
  }
  const size_t payload = size - kRawTensorHeaderBytes;
  if (h[7] == 0xFF) {
    p->set_k(payload / (p->value_format() == v1::VALUE_FORMAT_FP16 ? 2 : 4));
  } else {
    p->set_k(h[7]);
  }
  p->set_seed(0x5EED0000u ^ t.num_elements());
  t.set_payload(data + kRawTensorHeaderBytes, payload);
  return t;
}

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// DecodeAccumulate into `n` floats; a rejection must leave them unchanged.
absl::Status DecodeInto(const Codec& codec, const v1::EncodedTensor& t,
                        uint64_t n) {
  std::vector<float> acc(n);
  for (uint64_t i = 0; i < n; ++i) acc[i] = 0.25f * static_cast<float>(i % 7);
  const std::vector<float> before = acc;
  absl::Status s = codec.DecodeAccumulate(t, 0.5f, absl::MakeSpan(acc));
  if (!s.ok()) {
    Check(n == 0 || std::memcmp(acc.data(), before.data(), n * 4) == 0);
  }
  return s;
}

}  // namespace
}  // namespace fuzz
}  // namespace pserver

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pserver;
  using namespace pserver::fuzz;
  if (size < 1) return 0;
  v1::EncodedTensor t;
  if (data[0] % 2 == kCodecProto) {
    if (!t.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  } else {
    if (size < 1 + kRawTensorHeaderBytes) return 0;
    t = FromRaw(data + 1, size - 1);
  }
  const Codec* codec = DecoderFor(t.codec());
  if (codec == nullptr) {
    Check(!ValidateTensor(t, t.num_elements()).ok());
    return 0;
  }
  const uint64_t n = t.num_elements();
  // Sizes alone: none of these may allocate n floats or overflow.
  absl::Status valid = codec->Validate(t, n);
  (void)codec->Validate(t, n + 1);
  (void)codec->Validate(t, n - 1);
  (void)codec->Validate(t, ~uint64_t{0});
  (void)ValidateTensor(t, ~uint64_t{0});
  absl::StatusOr<ValidatedTensor> token = ValidateTensor(t, n);
  // MakeCodec accepts exactly the params ValidateTensor accepts (segments
  // and unchanged are no codecs to make: their validation alone counts).
  const bool makeable = t.codec() == v1::CODEC_SEGMENTS ||
                        t.codec() == v1::CODEC_UNCHANGED ||
                        MakeCodec(t.codec(), t.params()).ok();
  Check(token.ok() == (makeable && valid.ok()));
  if (n > kMaxDecodeElements) return 0;

  absl::Status decoded = DecodeInto(*codec, t, n);
  Check(decoded.ok() == valid.ok());
  if (n + 1 <= kMaxDecodeElements) Check(!DecodeInto(*codec, t, n + 1).ok());
  if (n > 0) Check(!DecodeInto(*codec, t, n - 1).ok());
  if (valid.ok()) {
    std::vector<float> out(n, 1.0f);
    Check(codec->Decode(t, absl::MakeSpan(out)).ok());
    if (token.ok()) {
      std::vector<float> again(n, 2.0f);
      token->DecodeInto(absl::MakeSpan(again));
      Check(n == 0 || std::memcmp(out.data(), again.data(), n * 4) == 0);
    }
  }
  return 0;
}
