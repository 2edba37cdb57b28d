// Measures a codec on a tensor's real gradients over a window of consecutive
// steps: payload bytes, the relative error of one round trip without error
// feedback, the error that reaches the model over the window with error
// feedback, and encode/decode throughput. The codec profiler
// (tests/bench/codec_profile.cc) and the tuner build on it.
//
// Errors are relative L2 norms, accumulated in double:
//   per step, no EF:  ||g_t - D(E(g_t))|| / ||g_t||
//   window, no EF:    ||sum_t g_t - sum_t D(E(g_t))|| / ||sum_t g_t||
//   per step, EF:     ||g_t - D(E(g_t + e_t))|| / ||g_t||
//   window, EF:       ||sum_t g_t - sum_t D(E(g_t + e_t))|| / ||sum_t g_t||
// the last being what the model sees: with decay 1 it is ||e_W|| / ||sum g||
// (common/error_feedback.h), the error still held back after W steps.
//
// Usage:
//   std::vector<absl::Span<const float>> steps = ...;  // one tensor, W steps
//   absl::StatusOr<CodecProfile> p = ProfileCodec(*codec, steps, {});
//   p->ef_window_error();
#ifndef PSERVER_TUNE_CODEC_PROFILE_H_
#define PSERVER_TUNE_CODEC_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/codec.h"

namespace pserver {

struct ProfileOptions {
  // Timed repetitions; the throughput is the median's.
  int repetitions = 5;
  // Each timed repetition encodes (decodes) the window's steps as many times
  // as one untimed pass says it takes to last this long, so that tiny
  // tensors are not timed at the clock's resolution (at most 10^6 passes).
  double min_timed_seconds = 0.002;
  float ef_decay = 1.0f;
  // Step t of the window encodes with seed MixPair(seed, t).
  uint64_t seed = 1;
};

// One codec on one tensor (or, through CombineProfiles, on several) over a
// window of W steps. Holds the sums the figures derive from, so that
// profiles of a model's tensors add up to the model's.
struct CodecProfile {
  uint64_t elements = 0;  // per step
  // Per step t (W entries): payload bytes without and with error feedback,
  // ||g_t||^2, ||g_t - D(E(g_t))||^2 and ||g_t - D(E(g_t + e_t))||^2.
  std::vector<uint64_t> bytes;
  std::vector<uint64_t> ef_bytes;
  std::vector<double> g_sq;
  std::vector<double> err_sq;
  std::vector<double> ef_err_sq;
  // ||sum g||^2, ||sum g - sum D(E(g))||^2, ||sum g - sum D(E(g + e))||^2.
  double window_g_sq = 0;
  double window_err_sq = 0;
  double ef_window_err_sq = 0;
  // Seconds to encode (decode) the window's W steps once: the median over
  // the repetitions, each divided by its number of passes. ef_encode is
  // ErrorFeedback::Encode (the codec's fused kernel if it has one), as the
  // worker runs it.
  double encode_seconds = 0;
  double ef_encode_seconds = 0;
  double decode_seconds = 0;

  size_t steps() const { return g_sq.size(); }
  double mean_bytes() const;     // per step, without error feedback
  double mean_ef_bytes() const;  // per step, with it
  double ratio() const;          // fp32 bytes / mean_bytes
  double rel_error() const;      // mean over steps, no EF
  double window_error() const;   // no EF
  double ef_step_error() const;  // mean over steps, EF
  double ef_window_error() const;
  double encode_elements_per_second() const;
  double ef_encode_elements_per_second() const;
  double decode_elements_per_second() const;
};

// ||a|| / ||b|| from squared norms: 0 when both are 0, +infinity when only
// b is.
double RelativeNorm(double a_sq, double b_sq);

// Runs `codec` over `steps` (one tensor's gradients at consecutive steps,
// all the same length, finite). INVALID_ARGUMENT for no steps, steps of
// different lengths, an empty tensor or options out of range; a codec error
// (non-finite input) is returned as is.
absl::StatusOr<CodecProfile> ProfileCodec(
    const Codec& codec, absl::Span<const absl::Span<const float>> steps,
    const ProfileOptions& options);

// The profile of several tensors taken together (a whole model): bytes,
// squared norms, elements and times add up. INVALID_ARGUMENT for no
// profiles or profiles of different window lengths.
absl::StatusOr<CodecProfile> CombineProfiles(
    absl::Span<const CodecProfile> parts);

// A codec configuration to profile: a label ("onebit b256 l2"), the family
// it is plotted with ("onebit"), the codec and its params.
struct CodecCandidate {
  std::string label;
  std::string family;
  v1::Codec codec = v1::CODEC_UNSPECIFIED;
  v1::CodecParams params;
};

// Every codec over the profiler's sweep: fp32, fp16, bf16; onebit with
// blocks 32, 256, 2048 and 2^20 (one per tensor up to 2^20 elements), mean_abs and l2 scales; quantize
// with 2, 4, 6, 8 bits, linear and adaptive ranges, nearest and stochastic
// rounding (block 256); topk, topk_quantize (4 and 8 bits) and randomk
// keeping 0.1%, 1%, 5% and 10%.
std::vector<CodecCandidate> CodecSweep();

}  // namespace pserver

#endif  // PSERVER_TUNE_CODEC_PROFILE_H_
