// Block TopK, a structured sparsification: the span is cut into blocks (rows
// of row_length elements, each cut into block_size pieces from its start;
// codec.proto has the exact layout) and the k blocks b of largest
// ||u_b||_2 are sent, one index per block instead of one per element.
// Payload: varint count, varint block number gaps (topk_indices.cc), then
// the chosen blocks' values in value_format.
//
// The norm compared is the sum of squares in double, summed in element
// order: squares of finite floats are exact in double and 64 of them cannot
// overflow (64 * 2^256 < 2^1024), so a non-finite sum means a non-finite
// element, and the order (ties to the lower block) is reproducible.
#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/fused_feedback.h"
#include "common/impl/codecs.h"
#include "common/impl/scratch.h"
#include "common/impl/topk_select.h"
#include "common/impl/wire_scalar.h"

namespace pserver {
namespace impl {
namespace {

// The blocks of a span of n elements: n / row rows (row = n when flat) of
// per_row blocks each; block b of a row holds min(block, row - b * block)
// elements. REQUIRES: row is 0 (flat) or divides n; block >= 1.
struct BlockGrid {
  BlockGrid(uint64_t n, uint64_t block_size, uint64_t row_length)
      : row(row_length == 0 ? n : row_length),
        block(block_size),
        per_row(row == 0 ? 1 : CeilDiv(row, block)),
        blocks(row == 0 ? 0 : n / row * per_row) {}

  uint64_t Start(uint64_t b) const {
    return b / per_row * row + b % per_row * block;
  }
  uint64_t Length(uint64_t b) const {
    return std::min(block, row - b % per_row * block);
  }
  // Whether every block holds `block` elements.
  bool Uniform() const { return row % block == 0; }

  uint64_t row, block, per_row, blocks;
};

// The row length an encoder uses for n elements: row_length if it divides
// n, else 0 (flat), as codec.proto says.
uint64_t EffectiveRow(uint64_t n, uint64_t row_length) {
  if (row_length == 0 || row_length > n || n % row_length != 0) return 0;
  return row_length;
}

// Blocks kept out of `blocks`: params.k if set, else ceil(k_fraction *
// blocks), at least 1 and at most blocks. The ceiling takes a relative
// slack of 1e-12 so that a product which rounding pushed just above an
// integer (0.07 * 100 is 7.000000000000001 in double) keeps that integer.
uint64_t BlocksToKeep(const v1::CodecParams& p, uint64_t blocks) {
  if (blocks == 0) return 0;
  uint64_t k = p.k();
  if (k == 0) {
    const double want = std::ceil(p.k_fraction() *
                                  static_cast<double>(blocks) * (1.0 - 1e-12));
    k = want < 1.0 ? 1 : static_cast<uint64_t>(want);
  }
  return std::min(k, blocks);
}

struct BlockScratch {
  Buffer<double> norms;  // sum of squares per block
  Buffer<double> order;  // selection's workspace (KthLargest)
  Buffer<uint64_t> chosen;
  Buffer<float> values;  // the chosen blocks' elements, in order
  Buffer<uint8_t> bytes;  // encoded gaps (AppendIndices)
};

// norms[b] = sum of u_i^2 over block b, in double, in element order.
// Full blocks go eight at a time: each block's sum is still one chain in
// element order, but eight independent chains (which the compiler pairs
// into SIMD lanes) hide the adds' latency: about twice the encode rate of
// one block at a time, measured at block 16.
// For the blocks of x[0..len), cut from x's start (the last one shorter
// when w does not divide len). Returns the number of blocks.
uint64_t SumSquaresRun(const float* x, uint64_t len, uint64_t w,
                       double* norms) {
  constexpr uint64_t kWays = 8;
  auto sq = [](float v) {
    return static_cast<double>(v) * static_cast<double>(v);
  };
  const uint64_t full = len / w;
  uint64_t b = 0;
  for (; b + kWays <= full; b += kWays, x += kWays * w) {
    double sum[kWays] = {};
    for (uint64_t i = 0; i < w; ++i) {
      for (uint64_t m = 0; m < kWays; ++m) sum[m] += sq(x[m * w + i]);
    }
    std::copy(sum, sum + kWays, norms + b);
  }
  for (uint64_t at = b * w; at < len; at += w, ++b, x += w) {
    const uint64_t n = std::min(w, len - at);
    double sum = 0.0;
    for (uint64_t i = 0; i < n; ++i) sum += sq(x[i]);
    norms[b] = sum;
  }
  return b;
}

void SumSquares(absl::Span<const float> u, const BlockGrid& grid,
                double* norms) {
  for (uint64_t r = 0; r < u.size(); r += grid.row) {
    norms += SumSquaresRun(u.data() + r, grid.row, grid.block, norms);
  }
}

// Error feedback's u = g + decay * e_in into e_out and the block sums of
// squares of u, a tile at a time so that the sums read u from cache.
void FormAndSumSquares(absl::Span<const float> g, absl::Span<const float> e_in,
                       float decay, const BlockGrid& grid,
                       absl::Span<float> e_out, double* norms) {
  // Whole blocks of at most 16 KiB: tiles cut a row where its blocks do.
  const uint64_t tile = std::max<uint64_t>(1, 4096 / grid.block) * grid.block;
  // Raw pointers: Span's checked operator[] keeps the loop scalar.
  const float* gp = g.data();
  const float* ep = e_in.data();
  float* up = e_out.data();
  for (uint64_t r = 0; r < g.size(); r += grid.row) {
    for (uint64_t t = 0; t < grid.row; t += tile) {
      const uint64_t begin = r + t;
      const uint64_t len = std::min(tile, grid.row - t);
      float* u = up + begin;
      const float* gt = gp + begin;
      const float* et = ep + begin;
      for (uint64_t i = 0; i < len; ++i) {
        const float d = decay * et[i];  // rounded first, as the contract says
        u[i] = gt[i] + d;
      }
      norms += SumSquaresRun(u, len, grid.block, norms);
    }
  }
}

// Replaces the smallest value of the min-heap h[0..k) with v, which is
// larger, and sifts it down: one pass, where pop_heap + push_heap take two.
void ReplaceMin(double* h, uint64_t k, double v) {
  uint64_t i = 0;
  for (;;) {
    uint64_t c = 2 * i + 1;
    if (c >= k) break;
    if (c + 1 < k && h[c + 1] < h[c]) ++c;
    if (!(h[c] < v)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
}

// The k-th largest of norms[0..blocks). REQUIRES: 1 <= k < blocks.
double KthLargest(const double* norms, uint64_t blocks, uint64_t k,
                  BlockScratch* s) {
  if (k > blocks / 16) {
    double* work = s->order.Reserve(blocks);
    std::copy(norms, norms + blocks, work);
    std::nth_element(work, work + (k - 1), work + blocks,
                     std::greater<double>());
    return work[k - 1];
  }
  // Small k: a min-heap of the k largest so far. On data in no particular
  // order few blocks beat its top, so this is about one comparison per
  // block; at worst (increasing norms) O(blocks log k).
  double* work = s->order.Reserve(k);
  std::copy(norms, norms + k, work);
  std::make_heap(work, work + k, std::greater<double>());
  for (uint64_t b = k; b < blocks; ++b) {
    if (norms[b] > work[0]) ReplaceMin(work, k, norms[b]);
  }
  return work[0];
}

// chosen[0..k) = the k blocks of largest norm, ties to the lower block, in
// increasing order. REQUIRES: 1 <= k <= blocks; norms finite.
void SelectBlocks(const double* norms, uint64_t blocks, uint64_t k,
                  BlockScratch* s, uint64_t* chosen) {
  if (k == blocks) {
    for (uint64_t b = 0; b < blocks; ++b) chosen[b] = b;
    return;
  }
  // The k-th largest norm v: every block above v is kept, and the first
  // k - (blocks above v) blocks equal to v.
  const double v = KthLargest(norms, blocks, k, s);
  uint64_t above = 0;
  for (uint64_t b = 0; b < blocks; ++b) above += norms[b] > v;
  uint64_t ties = k - above;
  uint64_t c = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    if (norms[b] > v) {
      chosen[c++] = b;
    } else if (norms[b] == v && ties > 0) {
      chosen[c++] = b;
      --ties;
    }
  }
}

template <Scalar S>
void AccumulateBlocks(const BlockGrid& grid, IndexWalker* at,
                      const uint8_t* values, float alpha, float* acc) {
  for (uint64_t j = 0; j < at->count(); ++j) {
    const uint64_t b = at->Next();
    const uint64_t len = grid.Length(b);
    AccumulateScalars<S>(values, len, alpha, acc + grid.Start(b));
    values += len * kScalarBytes<S>;
  }
}

// Also its own fused error-feedback kernel: forming u and summing its
// squares in one pass, then the encoder's and decoder's own steps.
class BlockTopKCodec final : public CodecBase, public FusedFeedbackEncoder {
 public:
  explicit BlockTopKCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_BLOCK_TOPK, params) {}

  const FusedFeedbackEncoder* fused_feedback() const override { return this; }

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    const uint64_t row = EffectiveRow(u.size(), params().row_length());
    const BlockGrid grid(u.size(), params().block_size(), row);
    ScratchPool<BlockScratch>::Lease s = scratch_.Take();
    double* norms = s->norms.Reserve(grid.blocks);
    SumSquares(u, grid, norms);
    return Finish(u, row, grid, &*s, out);
  }

  absl::Status EncodeWithFeedback(absl::Span<const float> g,
                                  absl::Span<const float> e_in, float decay,
                                  uint64_t seed, v1::EncodedTensor* out,
                                  absl::Span<float> e_out) const override {
    // ErrorFeedback checked the sizes and decay (FusedFeedbackEncoder).
    const uint64_t row = EffectiveRow(g.size(), params().row_length());
    const BlockGrid grid(g.size(), params().block_size(), row);
    ScratchPool<BlockScratch>::Lease s = scratch_.Take();
    double* norms = s->norms.Reserve(grid.blocks);
    FormAndSumSquares(g, e_in, decay, grid, e_out, norms);
    absl::Status status = Finish(e_out, row, grid, &*s, out);
    if (!status.ok()) return status;
    // e_out = u - decode(*out), exactly as the generic algorithm computes it.
    AccumulateValid(*out, -1.0f, e_out);
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    s = CheckValueFormat(t.params());
    if (!s.ok()) return s;
    s = CheckBlockTopKBlock(t.params().block_size(), /*unset_ok=*/false);
    if (!s.ok()) return s;
    const uint64_t row = t.params().row_length();
    if (row != 0 && (row > n || n % row != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "params.row_length is ", row,
          "; expected 0 (flat) or a divisor of num_elements ", n));
    }
    const BlockGrid grid(n, t.params().block_size(), row);
    uint64_t count;
    size_t offset;
    s = ParseIndices(t.payload(), grid.blocks, &count, &offset, "blocks");
    if (!s.ok()) return s;
    // count <= payload bytes (ParseIndices), so these sums cannot overflow.
    uint64_t values = count * grid.block;
    if (!grid.Uniform()) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(t.payload().data());
      IndexWalker at(p, p + t.payload().size());
      values = 0;
      for (uint64_t j = 0; j < count; ++j) values += grid.Length(at.Next());
    }
    const v1::ValueFormat f = t.params().value_format();
    const size_t rest = t.payload().size() - offset;
    if (rest % ValueBytes(f) != 0 || rest / ValueBytes(f) != values) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload has ", rest, " value bytes after the block indices; "
          "expected ", values * ValueBytes(f), " for the ", values,
          " values of ", count, " blocks"));
    }
    return CheckValues(
        reinterpret_cast<const uint8_t*>(t.payload().data()) + offset,
        values, f, "block_topk");
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    const BlockGrid grid(acc.size(), t.params().block_size(),
                         t.params().row_length());
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.payload().data());
    IndexWalker at(p, p + t.payload().size());
    const uint8_t* values = at.ValuesBegin();
    if (t.params().value_format() == v1::VALUE_FORMAT_FP16) {
      AccumulateBlocks<Scalar::kFp16>(grid, &at, values, alpha, acc.data());
    } else {
      AccumulateBlocks<Scalar::kFp32>(grid, &at, values, alpha, acc.data());
    }
  }

 private:
  // *out = the encoding of u cut as `grid` (for row_length: 0 = flat), whose
  // block sums of squares are in s->norms; INVALID_ARGUMENT naming the first
  // non-finite u_i.
  absl::Status Finish(absl::Span<const float> u, uint64_t row_length,
                      const BlockGrid& grid, BlockScratch* s,
                      v1::EncodedTensor* out) const {
    const double* norms = s->norms.data();
    bool finite = true;
    for (uint64_t b = 0; b < grid.blocks; ++b) {
      finite &= std::isfinite(norms[b]);
    }
    if (!finite) return CheckFinite(u);  // names the first bad element
    const uint64_t k = BlocksToKeep(params(), grid.blocks);
    uint64_t* chosen = s->chosen.Reserve(k);
    if (k > 0) SelectBlocks(norms, grid.blocks, k, s, chosen);
    uint64_t total = 0;
    for (uint64_t j = 0; j < k; ++j) total += grid.Length(chosen[j]);
    float* values = s->values.Reserve(total);
    float* v = values;
    for (uint64_t j = 0; j < k; ++j) {
      const float* x = u.data() + grid.Start(chosen[j]);
      v = std::copy(x, x + grid.Length(chosen[j]), v);
    }
    StartOutput(u.size(), out);
    out->mutable_params()->set_k(k);
    out->mutable_params()->set_row_length(row_length);
    std::string* payload = out->mutable_payload();
    payload->reserve(k * 2 + total * ValueBytes(params().value_format()) +
                     32);
    AppendIndices(absl::MakeConstSpan(chosen, k), &s->bytes, payload);
    AppendValues(absl::MakeConstSpan(values, total), params().value_format(),
                 payload);
    return absl::OkStatus();
  }

  // Encoding workspaces (codec.h: calls may run concurrently).
  mutable ScratchPool<BlockScratch> scratch_;
};

}  // namespace

absl::Status CheckBlockTopKBlock(uint32_t b, bool unset_ok) {
  if ((b == 0 && unset_ok) ||
      (b >= kBlockTopKMinBlock && b <= kBlockTopKMaxBlock)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "params.block_size is ", b, "; expected ", kBlockTopKMinBlock, "..",
      kBlockTopKMaxBlock, " for block_topk",
      unset_ok ? absl::StrCat(" (unset: ", kBlockTopKDefaultBlock, ")")
               : std::string()));
}

std::unique_ptr<Codec> NewBlockTopKCodec(const v1::CodecParams& params) {
  return std::make_unique<BlockTopKCodec>(params);
}

}  // namespace impl
}  // namespace pserver
