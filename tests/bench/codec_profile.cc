// codec_profile: every codec of the sweep (tune/codec_profile.h,
// CodecSweep) on gradients captured from a real run (pserver_worker
// --capture_gradients), per window of consecutive captured steps, per tensor
// and for the whole model. Writes every figure as JSON and prints the
// whole-model table of each window. tests/bench/codec_profile.sh captures
// the reference workload and turns the JSON into the committed
// table and plot (codec_profile_report.py).
//
//   codec_profile --gradients=g.bin --json=out.json
//                 [--window_names=early,middle,late] [--filter=onebit]
//
// Throughput is single-threaded, the median of --repetitions; it is only as
// quiet as the machine.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/codec.h"
#include "tune/codec_profile.h"
#include "tune/gradient_file.h"
#include "common/json_text.h"
#include "tune/tuner_measure.h"

ABSL_FLAG(std::string, gradients, "",
          "gradient file (pserver_worker --capture_gradients)");
ABSL_FLAG(std::string, json, "", "write every figure here as JSON");
ABSL_FLAG(std::string, window_names, "",
          "names of the windows of consecutive steps, in order (e.g. "
          "early,middle,late); default: 'steps A-B'");
ABSL_FLAG(std::string, filter, "",
          "profile only the codecs whose label contains one of these "
          "comma-separated strings (default: every codec of the sweep)");
ABSL_FLAG(int32_t, repetitions, 5, "timed repetitions (median)");
ABSL_FLAG(double, min_timed_seconds, 0.002,
          "seconds each timed repetition lasts at least");
ABSL_FLAG(float, ef_decay, 1.0f, "error-feedback residual decay");
ABSL_FLAG(uint64_t, seed, 1, "seed of stochastic rounding and randomk");

namespace pserver {
namespace {

int Fail(absl::string_view message) {
  std::fprintf(stderr, "codec_profile: %s\n", std::string(message).c_str());
  return 2;
}

struct Window {
  std::string name;
  size_t begin = 0, end = 0;  // indices into the capture's steps
};

std::string ResultJson(const Window& w, absl::string_view tensor,
                       const CodecCandidate& c, const CodecProfile& p) {
  return absl::StrCat(
      "{\"window\": ", JsonString(w.name), ", \"tensor\": ", JsonString(tensor),
      ", \"label\": ", JsonString(c.label), ", \"family\": ", JsonString(c.family),
      ", \"codec\": ", JsonString(CodecName(c.codec)), ", \"params\": ", CodecParamsJson(c.params),
      ", \"elements\": ", p.elements, ", \"steps\": ", p.steps(),
      ", \"bytes_per_step\": ", JsonNumber(p.mean_bytes()),
      ", \"ef_bytes_per_step\": ", JsonNumber(p.mean_ef_bytes()),
      ", \"ratio\": ", JsonNumber(p.ratio()), ", \"rel_error\": ", JsonNumber(p.rel_error()),
      ", \"window_error\": ", JsonNumber(p.window_error()),
      ", \"ef_step_error\": ", JsonNumber(p.ef_step_error()),
      ", \"ef_window_error\": ", JsonNumber(p.ef_window_error()),
      ", \"encode_elements_per_second\": ",
      JsonNumber(p.encode_elements_per_second()),
      ", \"ef_encode_elements_per_second\": ",
      JsonNumber(p.ef_encode_elements_per_second()),
      ", \"decode_elements_per_second\": ",
      JsonNumber(p.decode_elements_per_second()), "}");
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_gradients);
  if (path.empty()) return Fail("--gradients is empty; expected a file");
  ProfileOptions o;
  o.repetitions = absl::GetFlag(FLAGS_repetitions);
  o.min_timed_seconds = absl::GetFlag(FLAGS_min_timed_seconds);
  o.ef_decay = absl::GetFlag(FLAGS_ef_decay);
  o.seed = absl::GetFlag(FLAGS_seed);
  if (o.repetitions < 1) {
    return Fail(absl::StrCat("--repetitions is ", o.repetitions,
                             "; expected >= 1"));
  }
  std::vector<CodecCandidate> sweep;
  const std::vector<std::string> filter = absl::StrSplit(
      absl::GetFlag(FLAGS_filter), ',', absl::SkipEmpty());
  for (CodecCandidate& c : CodecSweep()) {
    bool keep = filter.empty();
    for (const std::string& f : filter) keep |= absl::StrContains(c.label, f);
    if (keep) sweep.push_back(std::move(c));
  }
  if (sweep.empty()) {
    return Fail(absl::StrCat("--filter '", absl::GetFlag(FLAGS_filter),
                             "' matches no codec of the sweep"));
  }

  absl::StatusOr<GradientCapture> capture = ReadGradientFile(path);
  if (!capture.ok()) return Fail(capture.status().ToString());
  if (capture->steps.empty()) {
    return Fail(absl::StrCat(path, " holds no steps; expected >= 1"));
  }
  // Every maximal run of consecutive step numbers is a window.
  absl::StatusOr<std::vector<StepWindow>> runs = SplitStepWindows(*capture, 0);
  if (!runs.ok()) return Fail(runs.status().ToString());
  std::vector<Window> windows;
  for (const StepWindow& r : *runs) windows.push_back({"", r.begin, r.end});
  const std::vector<std::string> names = absl::StrSplit(
      absl::GetFlag(FLAGS_window_names), ',', absl::SkipEmpty());
  if (!names.empty() && names.size() != windows.size()) {
    return Fail(absl::StrCat("--window_names has ", names.size(),
                             " names; expected ", windows.size(),
                             " (the file's windows of consecutive steps)"));
  }
  for (size_t i = 0; i < windows.size(); ++i) {
    Window& w = windows[i];
    w.name = names.empty()
                 ? absl::StrCat("steps ", capture->steps[w.begin].step, "-",
                                capture->steps[w.end - 1].step)
                 : names[i];
  }

  std::vector<std::string> results;
  for (const Window& w : windows) {
    std::printf("\n%s (%zu steps from %lu), %zu tensors, %lu elements\n",
                w.name.c_str(), w.end - w.begin,
                static_cast<unsigned long>(capture->steps[w.begin].step),
                capture->slots.size(),
                static_cast<unsigned long>(TotalElements(capture->layout)));
    std::printf("%-32s %9s %12s %10s %10s %10s %10s %10s %10s\n", "codec",
                "ratio", "bytes/step", "err", "win err", "EF win err",
                "enc Me/s", "EF enc", "dec Me/s");
    for (const CodecCandidate& c : sweep) {
      absl::StatusOr<std::unique_ptr<Codec>> codec =
          MakeCodec(c.codec, c.params);
      if (!codec.ok()) {
        return Fail(absl::StrCat(c.label, ": ", codec.status().ToString()));
      }
      std::vector<CodecProfile> parts;
      for (size_t t = 0; t < capture->slots.size(); ++t) {
        std::vector<absl::Span<const float>> steps;
        for (size_t s = w.begin; s < w.end; ++s) {
          steps.push_back(TensorValues(*capture, capture->steps[s], t));
        }
        absl::StatusOr<CodecProfile> p = ProfileCodec(**codec, steps, o);
        if (!p.ok()) {
          return Fail(absl::StrCat(w.name, ", ", capture->slots[t].name, ", ",
                                   c.label, ": ", p.status().ToString()));
        }
        results.push_back(ResultJson(w, capture->slots[t].name, c, *p));
        parts.push_back(*std::move(p));
      }
      absl::StatusOr<CodecProfile> model = CombineProfiles(parts);
      if (!model.ok()) return Fail(model.status().ToString());
      results.push_back(ResultJson(w, "(model)", c, *model));
      std::printf(
          "%-32s %9.2f %12.0f %10.3g %10.3g %10.3g %10.1f %10.1f %10.1f\n",
          c.label.c_str(), model->ratio(), model->mean_bytes(),
          model->rel_error(), model->window_error(), model->ef_window_error(),
          model->encode_elements_per_second() / 1e6,
          model->ef_encode_elements_per_second() / 1e6,
          model->decode_elements_per_second() / 1e6);
      std::fflush(stdout);
    }
  }

  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) {
    std::vector<std::string> tensors, windows_json, steps;
    for (size_t t = 0; t < capture->slots.size(); ++t) {
      const v1::TensorSpec& spec = capture->layout.tensors(t);
      tensors.push_back(absl::StrCat(
          "{\"name\": ", JsonString(spec.name()), ", \"shape\": [",
          absl::StrJoin(spec.shape(), ", "), "], \"elements\": ",
          capture->slots[t].size, "}"));
    }
    for (const Window& w : windows) {
      windows_json.push_back(absl::StrCat(
          "{\"name\": ", JsonString(w.name), ", \"first_step\": ",
          capture->steps[w.begin].step, ", \"last_step\": ",
          capture->steps[w.end - 1].step, ", \"steps\": ", w.end - w.begin,
          "}"));
    }
    std::ofstream out(json);
    out << "{\"gradients\": " << JsonString(path)
        << ",\n \"worker_id\": " << capture->worker_id
        << ",\n \"tensors\": [" << absl::StrJoin(tensors, ", ")
        << "],\n \"windows\": [" << absl::StrJoin(windows_json, ", ")
        << "],\n \"options\": {\"repetitions\": " << o.repetitions
        << ", \"min_timed_seconds\": " << JsonNumber(o.min_timed_seconds)
        << ", \"ef_decay\": " << JsonNumber(o.ef_decay) << ", \"seed\": " << o.seed
        << "},\n \"results\": [\n  " << absl::StrJoin(results, ",\n  ")
        << "\n ]}\n";
    out.close();
    if (!out) return Fail(absl::StrCat("--json ", json, ": cannot write"));
  }
  return 0;
}

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Profiles every codec on captured gradients.\n"
      "  codec_profile --gradients=FILE --json=OUT");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "codec_profile: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  return pserver::Run();
}
