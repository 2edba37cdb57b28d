#include "tune/tuner_measure.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pserver {

absl::StatusOr<std::vector<StepWindow>> SplitStepWindows(
    const GradientCapture& capture, size_t length) {
  if (capture.steps.empty()) {
    return absl::InvalidArgumentError(
        "the capture holds no steps; expected >= 1");
  }
  std::vector<StepWindow> runs;
  for (size_t i = 0; i < capture.steps.size(); ++i) {
    if (runs.empty() ||
        capture.steps[i].step != capture.steps[i - 1].step + 1) {
      runs.push_back({i, i});
    }
    runs.back().end = i + 1;
  }
  if (length == 0) return runs;
  std::vector<StepWindow> out;
  size_t longest = 0;
  for (const StepWindow& r : runs) {
    longest = std::max(longest, r.end - r.begin);
    for (size_t b = r.begin; b + length <= r.end; b += length) {
      out.push_back({b, b + length});
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("window is ", length, " steps; expected at most ", longest,
                     " (the longest run of consecutive captured steps)"));
  }
  return out;
}

std::vector<CodecCandidate> DefaultTunerCandidates() {
  const std::set<std::string> wanted = {
      "fp32",
      "bf16",
      "quantize 2b adaptive nearest",
      "quantize 4b adaptive nearest",
      "quantize 6b adaptive nearest",
      "quantize 8b adaptive nearest",
      "onebit b256 mean_abs",
      "topk 1%",
      "topk 5%",
      "topk 10%",
      "topk_quantize 1% 8b",
      "topk_quantize 5% 8b",
      "topk_quantize 10% 8b",
      "block_topk 1% b16",
      "block_topk 5% b16",
      "block_topk 10% b16",
  };
  std::vector<CodecCandidate> out;
  for (CodecCandidate& c : CodecSweep()) {
    if (wanted.count(c.label) != 0) out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<std::vector<CodecCandidate>> SelectCandidates(
    absl::string_view list) {
  const std::vector<CodecCandidate> sweep = CodecSweep();
  std::vector<bool> keep(sweep.size(), false);
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) continue;
    bool matched = false;
    for (size_t i = 0; i < sweep.size(); ++i) {
      if (absl::EqualsIgnoreCase(sweep[i].label, item) ||
          absl::EqualsIgnoreCase(sweep[i].family, item)) {
        keep[i] = true;
        matched = true;
      }
    }
    if (!matched) {
      std::vector<std::string> families;
      for (const CodecCandidate& c : sweep) {
        if (std::find(families.begin(), families.end(), c.family) ==
            families.end()) {
          families.push_back(c.family);
        }
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "'", item,
          "' is no codec of the sweep; expected a label such as "
          "'quantize 4b adaptive nearest' or 'topk 1%' (codec_profile's "
          "labels) or a family: ",
          absl::StrJoin(families, ", ")));
    }
  }
  std::vector<CodecCandidate> out;
  for (size_t i = 0; i < sweep.size(); ++i) {
    if (keep[i] || sweep[i].codec == v1::CODEC_FP32) out.push_back(sweep[i]);
  }
  return out;
}

absl::StatusOr<std::vector<TensorMeasurement>> MeasureCandidates(
    const GradientCapture& capture, absl::Span<const StepWindow> windows,
    absl::Span<const CodecCandidate> candidates,
    const ProfileOptions& options) {
  std::vector<std::unique_ptr<Codec>> codecs;
  for (const CodecCandidate& c : candidates) {
    absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(c.codec, c.params);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.label, ": ", codec.status().message()));
    }
    codecs.push_back(*std::move(codec));
  }
  std::vector<TensorMeasurement> out;
  for (size_t t = 0; t < capture.slots.size(); ++t) {
    TensorMeasurement m;
    m.name = capture.slots[t].name;
    m.elements = capture.slots[t].size;
    m.profiles.resize(candidates.size());
    for (const StepWindow& w : windows) {
      std::vector<absl::Span<const float>> steps;
      for (size_t s = w.begin; s < w.end; ++s) {
        steps.push_back(TensorValues(capture, capture.steps[s], t));
      }
      for (size_t c = 0; c < candidates.size(); ++c) {
        absl::StatusOr<CodecProfile> p =
            ProfileCodec(*codecs[c], steps, options);
        if (!p.ok()) {
          return absl::Status(p.status().code(),
                              absl::StrCat(m.name, ", ", candidates[c].label,
                                           ": ", p.status().message()));
        }
        m.profiles[c].push_back(*std::move(p));
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace pserver
