// The auto-tuner's choice (issue 13, part 2): per tensor of a model, one codec
// out of a list of candidates, from their profiles on captured gradients
// (tune/codec_profile.h), either the most compressing one within a target
// error or the most accurate allocation within a byte budget; and the
// compression schedule (common/schedule.h) that names those codecs per
// tensor. The profiles come from tune/tuner_measure.h; pserver_tune
// (tune/tune_main.cc) reads the capture and writes the files; this file
// does no I/O.
//
// Windows. A capture holds one or more windows of consecutive steps (e.g.
// early, middle and late in training); every candidate is profiled on each
// window separately, and a candidate's figures on a tensor are its worst
// over the windows: the largest bytes per step, the largest relative errors.
// The budget mode's objective, the absolute squared error that reaches the
// model, is summed over the windows.
//
//   std::vector<CodecCandidate> cands = DefaultTunerCandidates();
//   auto m = MeasureCandidates(capture, *SplitStepWindows(capture, 0), cands,
//                              ProfileOptions{});
//   TunerOptions o;
//   o.target_error = 0.05;
//   absl::StatusOr<TuneResult> r = TuneCodecs(cands, *m, o);
//   std::string json = *ScheduleToJson(TunedSchedule(cands, *r, nullptr));
#ifndef PSERVER_TUNE_CODEC_TUNER_H_
#define PSERVER_TUNE_CODEC_TUNER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tune/codec_profile.h"
#include "tune/tuner_measure.h"
#include "pserver/v1/schedule.pb.h"

namespace pserver {

struct TunerOptions {
  // Target-error mode when > 0: per tensor, the candidate with the fewest
  // bytes whose EF window error is <= target_error.
  double target_error = 0;
  // Budget mode when > 0: payload bytes per step for the whole model (see
  // BudgetBytesPerStep). The choice minimises the sum over tensors of the
  // absolute squared EF window error (CandidateSummary::ef_err_sq) within
  // the budget: the greedy on each tensor's lower convex hull of (bytes,
  // error), or, when it errs less, the exact multiple-choice knapsack
  // solved by dynamic programming on bytes rounded up to units of
  // budget / 4096 or finer (the greedy can strand a large tensor below an
  // upgrade that no longer fits once small tensors took theirs).
  double budget_bytes = 0;
  // Tensors of at most this many fp32 bytes stay fp32.
  uint64_t dense_below_bytes = 4096;
  // A candidate other than fp32 is considered only if it saves at least
  // this fraction of the tensor's fp32 bytes.
  double min_saving = 0.1;
};

// G * 1e9 / 8 * S * share: the bytes one worker may push (or pull) per step
// on a link of `link_gbps` when pushes get `share` of a step of
// `step_seconds`.
double BudgetBytesPerStep(double link_gbps, double step_seconds, double share);

// One candidate's figures on one tensor.
struct CandidateSummary {
  double bytes = 0;            // payload per step with EF, worst window
  double ratio = 0;            // fp32 bytes / bytes
  double ef_window_error = 0;  // relative, worst window
  double error = 0;            // one round trip without EF, worst window
  double ef_err_sq = 0;        // ||e_W||^2 summed over the windows
  double encode_elements_per_second = 0;  // EF encode, slowest window
  double decode_elements_per_second = 0;
  // False when the candidate saves less than TunerOptions::min_saving.
  bool eligible = true;
};

struct TensorChoice {
  std::string name;
  uint64_t elements = 0;
  size_t chosen = 0;   // index into the candidates
  std::string reason;  // "dense", "within target", "most accurate", "budget"
  std::vector<CandidateSummary> candidates;  // one per candidate, in order
  const CandidateSummary& choice() const { return candidates[chosen]; }
};

struct TuneResult {
  std::vector<TensorChoice> tensors;
  double bytes = 0;       // per step, the chosen codecs together
  double fp32_bytes = 0;  // per step, everything fp32
  // The model's EF window error with the chosen codecs, sqrt(sum of the
  // tensors' ||e_W||^2 / sum of their ||sum g||^2) per window, worst window.
  double ef_window_error = 0;
  // One round trip without EF: per step sqrt(sum of the tensors' squared
  // errors / sum of their ||g_t||^2), the mean over a window's steps, worst
  // window.
  double error = 0;
  double budget_bytes = 0;  // the options', 0 in target-error mode
};

// Chooses a codec per tensor. INVALID_ARGUMENT unless exactly one of
// target_error and budget_bytes is given (finite, > 0), when `candidates`
// holds no fp32, or when a measurement does not hold one list of profiles
// per candidate over the same windows; OUT_OF_RANGE "budget of B bytes per
// step is below the smallest encoding ..., M bytes per step" when even the
// cheapest choices do not fit. Deterministic: ties go to the earlier
// candidate.
absl::StatusOr<TuneResult> TuneCodecs(
    absl::Span<const CodecCandidate> candidates,
    absl::Span<const TensorMeasurement> tensors, const TunerOptions& options);

// A schedule of one phase named "tuned" for the whole run, with a
// TensorCodec per tensor: `push`'s choice as its push codec and, when `pull`
// is not null, `pull`'s as its pull codec. REQUIRES: both results come from
// `candidates` and, if pull is given, cover the same tensors in order.
v1::CompressionSchedule TunedSchedule(
    absl::Span<const CodecCandidate> candidates, const TuneResult& push,
    const TuneResult* pull);

// The schedule as JSON with the proto's field names (docs/schedules.md).
absl::StatusOr<std::string> ScheduleToJson(const v1::CompressionSchedule& s);

}  // namespace pserver

#endif  // PSERVER_TUNE_CODEC_TUNER_H_
