// What the auto-tuner (tune/codec_tuner.h) chooses from: the candidate
// codecs and their profiles (tune/codec_profile.h) on every tensor of a
// gradient capture, window by window. No I/O: the caller reads the capture.
//
//   absl::StatusOr<std::vector<StepWindow>> w = SplitStepWindows(capture, 0);
//   std::vector<CodecCandidate> cands = DefaultTunerCandidates();
//   auto m = MeasureCandidates(capture, *w, cands, ProfileOptions{});
#ifndef PSERVER_TUNE_TUNER_MEASURE_H_
#define PSERVER_TUNE_TUNER_MEASURE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tune/codec_profile.h"
#include "tune/gradient_file.h"

namespace pserver {

// Steps [begin, end) of a capture (indices into GradientCapture::steps).
struct StepWindow {
  size_t begin = 0;
  size_t end = 0;
};

// The capture's windows: every maximal run of consecutive step numbers, cut
// into windows of `length` steps when length > 0 (a run's remainder shorter
// than `length` is dropped). INVALID_ARGUMENT when the capture has no steps
// or, with length > 0, when no run holds `length` steps.
absl::StatusOr<std::vector<StepWindow>> SplitStepWindows(
    const GradientCapture& capture, size_t length);

// The default candidates: fp32, bf16, quantize 2/4/6/8-bit adaptive nearest,
// onebit (block 256, mean |u|), topk and topk_quantize (8-bit) at 1%, 5% and
// 10%, block_topk (block 16) at 1%, 5% and 10%; all taken from CodecSweep().
std::vector<CodecCandidate> DefaultTunerCandidates();

// The candidates a comma list names: each item a CodecSweep() label ("topk
// 1%") or family ("quantize": all its configurations), ASCII
// case-insensitive, in sweep order without repeats; fp32 is added when the
// list leaves it out. INVALID_ARGUMENT naming the first unknown item.
absl::StatusOr<std::vector<CodecCandidate>> SelectCandidates(
    absl::string_view list);

// One tensor's profiles: profiles[c][w] is candidate c on window w.
struct TensorMeasurement {
  std::string name;
  uint64_t elements = 0;
  std::vector<std::vector<CodecProfile>> profiles;
};

// Profiles every candidate on every tensor of `capture` over every window.
// Errors are ProfileCodec's and MakeCodec's, prefixed with the tensor and
// the candidate's label.
absl::StatusOr<std::vector<TensorMeasurement>> MeasureCandidates(
    const GradientCapture& capture, absl::Span<const StepWindow> windows,
    absl::Span<const CodecCandidate> candidates, const ProfileOptions& options);

}  // namespace pserver

#endif  // PSERVER_TUNE_TUNER_MEASURE_H_
