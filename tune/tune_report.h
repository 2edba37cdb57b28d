// What pserver_tune prints and writes besides the schedule: the table of the
// chosen codecs, the machine-readable JSON of every candidate's figures, and
// an SVG plot of error against bytes per step. Pure functions of the tuner's
// results (tune/codec_tuner.h); the caller writes the files.
#ifndef PSERVER_TUNE_TUNE_REPORT_H_
#define PSERVER_TUNE_TUNE_REPORT_H_

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "tune/codec_profile.h"
#include "tune/codec_tuner.h"

namespace pserver {

// One direction the tuner chose codecs for.
struct TunedDirection {
  std::string name;    // "push" or "pull"
  std::string source;  // the capture file it was measured on
  std::string mode;    // "target EF window error 0.05" or "budget ..."
  size_t windows = 0;
  size_t steps = 0;  // captured steps in the windows
  TuneResult result;
};

// The table: per tensor its name, elements, chosen codec, bytes per step,
// ratio against fp32, EF window error and error without EF; then the model.
std::string TuneTable(absl::Span<const CodecCandidate> candidates,
                      const TunedDirection& d);

// Every figure: {"push": {...}, "pull": {...} or null}, each with the mode,
// the model's totals and, per tensor, the choice and every candidate.
std::string TuneJson(absl::Span<const CodecCandidate> candidates,
                     const TunedDirection& push, const TunedDirection* pull);

// Error (EF window error, log) against bytes per step (log), one panel per
// tensor and direction (the largest kMaxPlotPanels tensors when there are
// more; none for tensors kept dense), one colour per codec family, the
// chosen codec ringed.
inline constexpr size_t kMaxPlotPanels = 24;
std::string TuneSvg(absl::Span<const CodecCandidate> candidates,
                    const TunedDirection& push, const TunedDirection* pull);

}  // namespace pserver

#endif  // PSERVER_TUNE_TUNE_REPORT_H_
