// pserver_tune: chooses a codec per tensor from gradients captured in a real
// run (pserver_worker --capture_gradients) and writes the compression
// schedule both daemons take (--schedule). docs/schedules.md, "Auto-tuner".
//
//   pserver_tune --gradients=g.bin --target_error=0.05 --out=tuned.json
//   pserver_tune --gradients=g.bin --link_gbps=1 --step_seconds=0.05
//       --out=tuned.json --svg=tuned.svg
//
// Exit status: 0 done; 2 a flag's value is out of range (one line naming
// the flag); 1 an input cannot be read or used, the budget cannot be met,
// or an output cannot be written (one line). Nothing is written unless the
// whole run succeeds; each file is replaced atomically.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tune/codec_profile.h"
#include "tune/codec_tuner.h"
#include "common/daemon/command_line.h"
#include "common/file_io.h"
#include "tune/gradient_file.h"
#include "common/layout.h"
#include "tune/tune_report.h"

ABSL_FLAG(std::string, gradients, "",
          "required: gradient capture file (pserver_worker "
          "--capture_gradients) the push codecs are chosen on");
ABSL_FLAG(std::string, deltas, "",
          "optional capture file, same layout, of the weight deltas a worker "
          "pulled: pull codecs are chosen on it (none written without it)");
ABSL_FLAG(int32_t, window, 0,
          "steps per window; 0: every run of consecutive captured steps is "
          "one window. Each window is profiled on its own and every figure "
          "is a candidate's worst over the windows");
ABSL_FLAG(std::string, candidates, "",
          "comma list of codec_profile sweep labels ('topk 1%') or families "
          "(quantize); empty: fp32, bf16, quantize 2/4/6/8-bit adaptive, "
          "onebit, topk and topk_quantize 8-bit at 1/5/10%, block_topk; fp32 "
          "is always a candidate");
ABSL_FLAG(std::optional<double>, target_error, std::nullopt,
          "target-error mode: per tensor the fewest bytes whose EF window "
          "error is at most this (> 0)");
ABSL_FLAG(std::optional<double>, link_gbps, std::nullopt,
          "budget mode (with --step_seconds): the link's Gbit/s per worker");
ABSL_FLAG(std::optional<double>, step_seconds, std::nullopt,
          "budget mode: the step time to meet, seconds");
ABSL_FLAG(double, push_share, 0.5,
          "budget mode: share of the step's link time for pushes (pulls get "
          "the rest), in (0, 1)");
ABSL_FLAG(uint64_t, dense_below_bytes, 4096,
          "tensors of at most this many fp32 bytes stay fp32");
ABSL_FLAG(float, ef_decay, 1.0f,
          "error-feedback residual decay, as the worker's --ef_decay");
ABSL_FLAG(uint64_t, seed, 1, "seed of stochastic rounding and randomk");
ABSL_FLAG(std::string, out, "",
          "write the schedule here (JSON, one phase 'tuned'); empty: print "
          "the table only");
ABSL_FLAG(std::string, svg, "", "optional: plot of error against bytes");
ABSL_FLAG(std::string, json, "", "optional: every figure as JSON");

namespace pserver {
namespace {

int Fail(int code, absl::string_view message) {
  std::fprintf(stderr, "pserver_tune: %s\n", std::string(message).c_str());
  return code;
}
int BadFlag(absl::string_view message) { return Fail(2, message); }

bool Positive(const std::optional<double>& v) {
  return v.has_value() && std::isfinite(*v) && *v > 0;
}

// One capture file: read, cut into windows, then profiled.
struct Measured {
  std::string flag;  // "gradients" or "deltas"
  std::string path;
  GradientCapture capture;
  std::vector<StepWindow> windows;
  std::vector<TensorMeasurement> tensors;
  size_t steps = 0;
};

absl::StatusOr<Measured> Read(const std::string& flag, const std::string& path,
                              size_t window) {
  Measured m;
  m.flag = flag;
  m.path = path;
  absl::StatusOr<GradientCapture> c = ReadGradientFile(path);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat("--", flag, ": ", c.status().message()));
  }
  m.capture = *std::move(c);
  absl::StatusOr<std::vector<StepWindow>> w =
      SplitStepWindows(m.capture, window);
  if (!w.ok()) {
    return absl::Status(
        w.status().code(),
        absl::StrCat("--", flag, " ", path, ": ", w.status().message()));
  }
  m.windows = *std::move(w);
  for (const StepWindow& sw : m.windows) m.steps += sw.end - sw.begin;
  return m;
}

absl::Status Profile(absl::Span<const CodecCandidate> candidates,
                     const ProfileOptions& po, Measured* m) {
  absl::StatusOr<std::vector<TensorMeasurement>> t =
      MeasureCandidates(m->capture, m->windows, candidates, po);
  if (!t.ok()) {
    return absl::Status(
        t.status().code(),
        absl::StrCat("--", m->flag, " ", m->path, ": ", t.status().message()));
  }
  m->tensors = *std::move(t);
  return absl::OkStatus();
}

int Run() {
  const std::string gradients = absl::GetFlag(FLAGS_gradients);
  const std::string deltas = absl::GetFlag(FLAGS_deltas);
  if (gradients.empty()) {
    return BadFlag(
        "--gradients is empty; expected a capture file (pserver_worker "
        "--capture_gradients)");
  }
  const int32_t window = absl::GetFlag(FLAGS_window);
  if (window < 0) {
    return BadFlag(absl::StrCat("--window is ", window,
                                "; expected >= 0 (0: runs of steps)"));
  }
  absl::StatusOr<std::vector<CodecCandidate>> candidates =
      absl::GetFlag(FLAGS_candidates).empty()
          ? DefaultTunerCandidates()
          : SelectCandidates(absl::GetFlag(FLAGS_candidates));
  if (!candidates.ok()) {
    return BadFlag(
        absl::StrCat("--candidates: ", candidates.status().message()));
  }

  const std::optional<double> target = absl::GetFlag(FLAGS_target_error);
  const std::optional<double> gbps = absl::GetFlag(FLAGS_link_gbps);
  const std::optional<double> step_s = absl::GetFlag(FLAGS_step_seconds);
  const double share = absl::GetFlag(FLAGS_push_share);
  const bool budget_mode = gbps.has_value() || step_s.has_value();
  if (target.has_value() == budget_mode) {
    return BadFlag(
        target.has_value()
            ? "--target_error and --link_gbps/--step_seconds are both set; "
              "expected one mode"
            : "none of --target_error or --link_gbps and --step_seconds is "
              "set; expected one mode");
  }
  TunerOptions push_opts, pull_opts;
  std::string push_mode, pull_mode;
  if (target.has_value()) {
    if (!Positive(target)) {
      return BadFlag(absl::StrCat("--target_error is ", *target,
                                  "; expected a finite value > 0"));
    }
    push_opts.target_error = pull_opts.target_error = *target;
    push_mode = pull_mode = absl::StrCat("target EF window error ", *target);
  } else {
    if (!Positive(gbps)) {
      return BadFlag(absl::StrCat(
          "--link_gbps is ", gbps.has_value() ? absl::StrCat(*gbps) : "unset",
          "; expected a finite value > 0"));
    }
    if (!Positive(step_s)) {
      return BadFlag(
          absl::StrCat("--step_seconds is ",
                       step_s.has_value() ? absl::StrCat(*step_s) : "unset",
                       "; expected a finite value > 0"));
    }
    if (!(share > 0 && share < 1)) {
      return BadFlag(
          absl::StrCat("--push_share is ", share, "; expected 0 < share < 1"));
    }
    push_opts.budget_bytes = BudgetBytesPerStep(*gbps, *step_s, share);
    pull_opts.budget_bytes = BudgetBytesPerStep(*gbps, *step_s, 1 - share);
    const std::string link =
        absl::StrCat(*gbps, " Gbit/s x ", *step_s, " s x ");
    push_mode = absl::StrFormat("budget %.0f bytes/step (%s%g)",
                                push_opts.budget_bytes, link, share);
    pull_mode = absl::StrFormat("budget %.0f bytes/step (%s%g)",
                                pull_opts.budget_bytes, link, 1 - share);
  }
  push_opts.dense_below_bytes = pull_opts.dense_below_bytes =
      absl::GetFlag(FLAGS_dense_below_bytes);
  ProfileOptions po;
  po.ef_decay = absl::GetFlag(FLAGS_ef_decay);
  po.seed = absl::GetFlag(FLAGS_seed);
  // The tuner needs the sizes and errors; one timed pass is enough for the
  // rough throughput it reports.
  po.repetitions = 1;
  po.min_timed_seconds = 0;
  if (!std::isfinite(po.ef_decay)) {
    return BadFlag(absl::StrCat("--ef_decay is ", po.ef_decay,
                                "; expected a finite value"));
  }

  // Both files are read and checked before the (longer) profiling.
  absl::StatusOr<Measured> g = Read("gradients", gradients, window);
  if (!g.ok()) return Fail(1, g.status().message());
  std::optional<Measured> d;
  if (!deltas.empty()) {
    absl::StatusOr<Measured> m = Read("deltas", deltas, window);
    if (!m.ok()) return Fail(1, m.status().message());
    const std::string diff =
        FirstLayoutDifference(m->capture.layout, g->capture.layout);
    if (!diff.empty()) {
      return Fail(1,
                  absl::StrCat("--deltas ", deltas,
                               ": layout differs from --gradients': ", diff));
    }
    d = *std::move(m);
  }
  if (absl::Status s = Profile(*candidates, po, &*g); !s.ok()) {
    return Fail(1, s.message());
  }
  if (d.has_value()) {
    if (absl::Status s = Profile(*candidates, po, &*d); !s.ok()) {
      return Fail(1, s.message());
    }
  }

  absl::StatusOr<TuneResult> push =
      TuneCodecs(*candidates, g->tensors, push_opts);
  const std::string budget_flags =
      "--link_gbps x --step_seconds x --push_share: ";
  if (!push.ok()) {
    return Fail(1, absl::StrCat(target ? "" : budget_flags, "push ",
                                push.status().message()));
  }
  TunedDirection push_dir{"push",    gradients,
                          push_mode, g->windows.size(),
                          g->steps,  *std::move(push)};
  std::optional<TunedDirection> pull_dir;
  if (d.has_value()) {
    absl::StatusOr<TuneResult> pull =
        TuneCodecs(*candidates, d->tensors, pull_opts);
    if (!pull.ok()) {
      return Fail(1, absl::StrCat(target ? "" : budget_flags, "pull ",
                                  pull.status().message()));
    }
    pull_dir =
        TunedDirection{"pull",   deltas,          pull_mode, d->windows.size(),
                       d->steps, *std::move(pull)};
  }
  const TunedDirection* pull = pull_dir.has_value() ? &*pull_dir : nullptr;

  // Everything is rendered before anything is written.
  std::vector<std::pair<std::string, std::string>> files;  // flag, path
  std::vector<std::string> contents;
  if (const std::string p = absl::GetFlag(FLAGS_json); !p.empty()) {
    files.push_back({"json", p});
    contents.push_back(TuneJson(*candidates, push_dir, pull));
  }
  if (const std::string p = absl::GetFlag(FLAGS_svg); !p.empty()) {
    files.push_back({"svg", p});
    contents.push_back(TuneSvg(*candidates, push_dir, pull));
  }
  // The schedule last: a failed plot leaves no schedule to be taken for
  // the tuner's complete answer.
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    absl::StatusOr<std::string> json = ScheduleToJson(TunedSchedule(
        *candidates, push_dir.result, pull ? &pull->result : nullptr));
    if (!json.ok()) return Fail(1, json.status().message());
    files.push_back({"out", out});
    contents.push_back(*std::move(json));
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (absl::Status s = WriteFileAtomically(files[i].second, contents[i]);
        !s.ok()) {
      return Fail(1, absl::StrCat("--", files[i].first, ": ", s.message()));
    }
  }

  std::printf("%s", TuneTable(*candidates, push_dir).c_str());
  if (pull != nullptr) {
    std::printf("\n%s", TuneTable(*candidates, *pull).c_str());
  } else {
    std::printf(
        "\nno pull codecs: --deltas not given, so the schedule has no pull "
        "entries (the shard's --pull_codec applies)\n");
  }
  if (!files.empty()) {
    std::printf("\nwrote");
    for (const auto& f : files) std::printf(" %s", f.second.c_str());
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  pserver::ParseDaemonCommandLine(
      argc, argv,
      {"pserver_tune",
       "Chooses a codec per tensor from captured gradients and writes the "
       "schedule the daemons take (--schedule).\n"
       "  pserver_tune --gradients=FILE --target_error=0.05 --out=tuned.json\n"
       "  pserver_tune --gradients=FILE --link_gbps=1 --step_seconds=0.05 "
       "--out=tuned.json",
       __FILE__});
  return pserver::Run();
}
