#include "common/validated_tensor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/impl/codecs.h"

namespace pserver {

absl::StatusOr<ValidatedTensor> ValidateTensor(const v1::EncodedTensor& t,
                                               uint64_t num_elements) {
  // Same checks in the same order as MakeDecoderFor(t) then Validate, so the
  // first problem reported is the one it reported.
  absl::StatusOr<const Codec*> decoder = FindDecoder(t.codec());
  if (!decoder.ok()) return decoder.status();
  absl::Status s = impl::CheckParams(t.params());
  if (!s.ok()) return s;
  // block_topk's own block_size range, before the element count as well (a
  // tensor always carries its block_size: 0 is not "the default" there).
  if (t.codec() == v1::CODEC_BLOCK_TOPK) {
    s = impl::CheckBlockTopKBlock(t.params().block_size(), /*unset_ok=*/false);
    if (!s.ok()) return s;
  }
  s = (*decoder)->Validate(t, num_elements);
  if (!s.ok()) return s;
  return ValidatedTensor(*decoder, &t);
}

void ValidatedTensor::CheckSize(size_t size) const {
  if (size != tensor_->num_elements()) {
    std::fprintf(stderr,
                 "ValidatedTensor: output holds %zu elements; the tensor has "
                 "%llu\n",
                 size,
                 static_cast<unsigned long long>(tensor_->num_elements()));
    std::abort();
  }
}

void ValidatedTensor::AccumulateInto(float alpha, absl::Span<float> acc) const {
  CheckSize(acc.size());
  decoder_->AccumulateValid(*tensor_, alpha, acc);
}

void ValidatedTensor::AddInto(absl::Span<const float> base,
                              absl::Span<float> out) const {
  CheckSize(base.size());
  CheckSize(out.size());
  decoder_->AddValid(*tensor_, base, out);
}

void ValidatedTensor::AssignInto(float alpha, absl::Span<float> out) const {
  CheckSize(out.size());
  decoder_->AssignValid(*tensor_, alpha, out);
}

void ValidatedTensor::DecodeInto(absl::Span<float> out) const {
  AssignInto(1.0f, out);
}

}  // namespace pserver
