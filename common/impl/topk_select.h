// Private to common/impl: TopK selection (topk_select.cc) for topk and
// topk_quantize, and the pieces that topk's fused error-feedback kernel
// (topk_feedback.cc) shares with it.
//
// Selection works on key(i) = float bits of |u_i|, whose unsigned order is
// the order of |u| (NaN and Inf sort above every finite value, which is how
// non-finite input is caught without an extra pass).
// EXACT: the k largest keys, ties to the lower index.
// SAMPLED: the threshold is the matching order statistic of a deterministic
// sample (its positions depend only on n); one filter pass keeps key >=
// threshold. If that keeps more than 1.1 k (and at most SampledCapacity(k)),
// exact selection runs on the kept elements only, which yields exactly the
// EXACT answer; fewer than 0.9 k, or more than the capacity, falls back to
// EXACT on everything.
#ifndef PSERVER_COMMON_IMPL_TOPK_SELECT_H_
#define PSERVER_COMMON_IMPL_TOPK_SELECT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/impl/scratch.h"
#include "common/internal/float16.h"
#include "common/internal/rng.h"
#include "pserver/v1/codec.pb.h"

namespace pserver {
namespace impl {

constexpr uint32_t kInfKey = 0x7f800000;
inline uint32_t KeyOf(float f) { return internal::FloatBits(f) & 0x7fffffff; }

// Filter kernels may write this many entries past the count they return.
constexpr size_t kFilterSlack = 32;
// The read-only filter pass prefetches u this many floats (8 KiB) ahead:
// measured on this machine kind, it lifts the pass from ~75% of the read
// bandwidth to ~95% (the hardware prefetchers alone do not run far enough
// ahead of a loop that does this much work per line). The error-feedback
// pass, bound by two reads and a write, measured slower with it.
constexpr size_t kStreamAhead = 2048;

// Selected positions (increasing) and their values.
struct Selected {
  Buffer<uint64_t> idx;
  Buffer<float> val;
  size_t count = 0;
  // Set by the filter passes: false if the input may hold a non-finite
  // value (then it is among the candidates).
  bool all_finite = false;

  // Room for n entries plus the filter kernels' slack.
  void Reserve(size_t n) {
    idx.Reserve(n + kFilterSlack);
    val.Reserve(n + kFilterSlack);
  }
  absl::Span<const uint64_t> indices() const { return {idx.data(), count}; }
  absl::Span<const float> values() const { return {val.data(), count}; }
};

struct Histograms;  // the exact selection's radix tables (topk_select.cc)

// Everything one selection needs besides its input; reused call after call
// (a codec keeps them in a ScratchPool). Thread-compatible.
struct TopKScratch {
  TopKScratch();
  ~TopKScratch();

  Selected sel;      // the answer
  Selected refined;  // exact selection among sampled candidates
  Buffer<uint32_t> sample;
  Buffer<uint32_t> keys;
  // The sample's positions for tensors of positions_n elements (they depend
  // only on n, and a stream encodes the same n every step).
  Buffer<uint64_t> positions;
  size_t positions_n = 0;
  Buffer<uint8_t> bytes;             // encoded index gaps (AppendIndices)
  std::unique_ptr<Histograms> hist;  // made by the first exact selection
};

// The k largest |u| into s->sel as the header comment says. INVALID_ARGUMENT
// names the first non-finite element of u.
absl::Status SelectTopK(absl::Span<const float> u, uint64_t k,
                        v1::TopKSelection selection, TopKScratch* s);
// EXACT selection of 1 <= k < u.size() elements into *out, using the
// tables and buffers of s. REQUIRES: out does not hold u.
absl::Status SelectExact(absl::Span<const float> u, uint64_t k,
                         TopKScratch* s, Selected* out);

// The elements with key >= threshold, in index order, into *out (count and
// all_finite set): returns the count, or cap + 1 if there are more than cap
// (then out's contents are unspecified). REQUIRES: threshold >= 1.
// topk_filter.cc.
size_t FilterCandidates(absl::Span<const float> u, uint32_t threshold,
                        size_t cap, Selected* out);

// ---- Sampled selection, step by step ----
// SAMPLED is used when 1 <= k < n and n is at least this.
constexpr size_t kMinSampledElements = size_t{1} << 16;

// The deterministic sample: m positions, one per stride, position j at a
// pseudo-random offset inside its stride.
struct SamplePlan {
  explicit SamplePlan(size_t n);
  size_t Position(size_t j) const {
    return j * stride +
           static_cast<size_t>(internal::Below(internal::Draw(key, j), stride));
  }
  size_t n, m, stride;
  uint64_t key;
};

// How far ahead the sample gathers prefetch.
constexpr size_t kSampleAhead = 32;

// plan's positions, from s->positions when they were made for plan.n.
const uint64_t* SamplePositions(const SamplePlan& plan, TopKScratch* s);

// The threshold key from the m sample keys in keys[0..m) (reordered): about
// 1.03 * want of n keys are >= it. 0 or >= kInfKey means "do not filter"
// (degenerate sample or non-finite input): run EXACT instead.
uint32_t SampleThreshold(const SamplePlan& plan, uint64_t want,
                         uint32_t* keys);

// Candidates a filter pass may keep before SAMPLED gives up on them.
inline size_t SampledCapacity(uint64_t k) { return k + k / 2 + 64; }

// What to do with the c = s->sel.count candidates of a filter pass that kept
// at most SampledCapacity(k).
enum class SampledOutcome {
  kDone,       // s->sel is the answer (0.9 k <= c <= 1.1 k)
  kRefined,    // s->refined.idx holds the chosen candidates' ranks among
               // them (increasing); call KeepRefined
  kFallBack,   // too few: run SelectExact on everything
};
// Fails with INVALID_ARGUMENT if a candidate is not finite (every
// non-finite element is a candidate, in index order).
absl::Status JudgeCandidates(uint64_t k, TopKScratch* s,
                             SampledOutcome* outcome);
// s->sel = the candidates whose ranks are in s->refined.
void KeepRefined(TopKScratch* s);

// ---- TopK with error feedback (topk_feedback.cc) ----
// u = g + decay * e_in (the product rounded to fp32 first); selects as
// SelectTopK(u, k, selection) into s->sel; e_out = u - decode(u's selected
// values in format f). Bit for bit the generic error-feedback algorithm,
// in one pass over memory for SAMPLED selection. On error (INVALID_ARGUMENT
// naming the first non-finite u_i) s->sel and e_out are unspecified.
// REQUIRES: g, e_in and e_out have the same size; e_out overlaps neither.
absl::Status SelectWithFeedback(absl::Span<const float> g,
                                absl::Span<const float> e_in, float decay,
                                uint64_t k, v1::TopKSelection selection,
                                v1::ValueFormat f, absl::Span<float> e_out,
                                TopKScratch* s);

// Appends varint count and gaps of idx to *out (layout: topk_indices.cc),
// staging them in *bytes.
void AppendIndices(absl::Span<const uint64_t> idx, Buffer<uint8_t>* bytes,
                   std::string* out);

}  // namespace impl
}  // namespace pserver

#endif  // PSERVER_COMMON_IMPL_TOPK_SELECT_H_
