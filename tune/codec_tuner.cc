#include "tune/codec_tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace pserver {
namespace {

bool Positive(double v) { return std::isfinite(v) && v > 0; }

// One candidate on one tensor, from its profiles over the windows.
CandidateSummary Summarize(uint64_t elements,
                           const std::vector<CodecProfile>& windows) {
  CandidateSummary s;
  bool first = true;
  for (const CodecProfile& p : windows) {
    const double enc = p.ef_encode_elements_per_second();
    const double dec = p.decode_elements_per_second();
    s.bytes = std::max(s.bytes, p.mean_ef_bytes());
    s.ef_window_error = std::max(s.ef_window_error, p.ef_window_error());
    s.error = std::max(s.error, p.rel_error());
    s.ef_err_sq += p.ef_window_err_sq;
    s.encode_elements_per_second =
        first ? enc : std::min(s.encode_elements_per_second, enc);
    s.decode_elements_per_second =
        first ? dec : std::min(s.decode_elements_per_second, dec);
    first = false;
  }
  s.ratio =
      s.bytes > 0 ? static_cast<double>(Fp32Bytes(elements)) / s.bytes : 0.0;
  return s;
}

// The candidates a tensor may take: fp32 always; the others if they save
// enough, and none but fp32 for a tensor at most dense_below_bytes.
std::vector<size_t> Eligible(const TensorChoice& t, size_t fp32,
                             const TunerOptions& o) {
  if (Fp32Bytes(t.elements) <= o.dense_below_bytes) return {fp32};
  std::vector<size_t> out;
  for (size_t c = 0; c < t.candidates.size(); ++c) {
    if (c == fp32 || t.candidates[c].eligible) out.push_back(c);
  }
  return out;
}

void ChooseWithinTarget(const std::vector<size_t>& eligible, double target,
                        TensorChoice* t) {
  const std::vector<CandidateSummary>& s = t->candidates;
  bool found = false;
  size_t best = eligible.front();
  for (size_t c : eligible) {
    if (!(s[c].ef_window_error <= target)) continue;
    if (!found || s[c].bytes < s[best].bytes ||
        (s[c].bytes == s[best].bytes &&
         s[c].ef_window_error < s[best].ef_window_error)) {
      best = c;
      found = true;
    }
  }
  if (found) {
    t->chosen = best;
    t->reason = "within target";
    return;
  }
  // Unreachable with fp32 among the candidates (its error is 0), kept for
  // the contract: the most accurate, then the cheapest.
  for (size_t c : eligible) {
    if (s[c].ef_window_error < s[best].ef_window_error ||
        (s[c].ef_window_error == s[best].ef_window_error &&
         s[c].bytes < s[best].bytes)) {
      best = c;
    }
  }
  t->chosen = best;
  t->reason = "most accurate";
}

// The lower convex hull of the points (bytes, ef_err_sq) of `eligible`, from
// the cheapest: each later point costs more and errs less, at a falling
// error reduction per byte.
std::vector<size_t> LowerHull(const std::vector<size_t>& eligible,
                              const std::vector<CandidateSummary>& s) {
  std::vector<size_t> sorted = eligible;
  std::stable_sort(sorted.begin(), sorted.end(), [&](size_t a, size_t b) {
    if (s[a].bytes != s[b].bytes) return s[a].bytes < s[b].bytes;
    return s[a].ef_err_sq < s[b].ef_err_sq;
  });
  std::vector<size_t> hull;
  for (size_t c : sorted) {
    // Dominated: a cheaper point errs as little.
    if (!hull.empty() && s[c].ef_err_sq >= s[hull.back()].ef_err_sq) continue;
    // Pop points above the segment from the one before to c.
    while (hull.size() >= 2) {
      const CandidateSummary& a = s[hull[hull.size() - 2]];
      const CandidateSummary& b = s[hull.back()];
      const double cross =
          (b.bytes - a.bytes) * (s[c].ef_err_sq - a.ef_err_sq) -
          (b.ef_err_sq - a.ef_err_sq) * (s[c].bytes - a.bytes);
      if (cross > 0) break;  // b lies below the segment a-c: keep it
      hull.pop_back();
    }
    hull.push_back(c);
  }
  return hull;
}

double TotalErrSq(const std::vector<TensorChoice>& tensors,
                  const std::vector<size_t>& pick) {
  double e = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    e += tensors[t].candidates[pick[t]].ef_err_sq;
  }
  return e;
}

// Greedy on the lower convex hulls: every tensor at its cheapest point, then
// the upgrade with the largest error reduction per extra byte that still
// fits, until none does. On convex hulls this is optimal up to the first
// upgrade that does not fit; past it, a large tensor that cannot take its
// next step is left behind while small ones take theirs.
std::vector<size_t> GreedyAllocation(
    const std::vector<TensorChoice>& tensors,
    const std::vector<std::vector<size_t>>& options, double budget) {
  std::vector<std::vector<size_t>> hulls;
  std::vector<size_t> at(tensors.size(), 0);
  double used = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    hulls.push_back(LowerHull(options[t], tensors[t].candidates));
    used += tensors[t].candidates[hulls[t].front()].bytes;
  }
  std::vector<bool> stuck(tensors.size(), false);
  for (;;) {
    size_t best = tensors.size();
    double best_gain = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (stuck[t] || at[t] + 1 >= hulls[t].size()) continue;
      const CandidateSummary& a = tensors[t].candidates[hulls[t][at[t]]];
      const CandidateSummary& b = tensors[t].candidates[hulls[t][at[t] + 1]];
      if (used - a.bytes + b.bytes > budget) {
        stuck[t] = true;  // later points cost more still
        continue;
      }
      const double gain = (a.ef_err_sq - b.ef_err_sq) / (b.bytes - a.bytes);
      if (best == tensors.size() || gain > best_gain) {
        best = t;
        best_gain = gain;
      }
    }
    if (best == tensors.size()) break;
    const size_t from = hulls[best][at[best]];
    const size_t to = hulls[best][++at[best]];
    used += tensors[best].candidates[to].bytes -
            tensors[best].candidates[from].bytes;
  }
  std::vector<size_t> pick(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) pick[t] = hulls[t][at[t]];
  return pick;
}

// The multiple-choice knapsack solved exactly by dynamic programming over
// the budget cut into 4096 to 65536 units, every candidate's bytes rounded
// up to whole units (so the answer always fits; rounding may only cost it a
// better choice). Finds what the greedy leaves behind. Empty when the
// rounding leaves nothing feasible.
std::vector<size_t> KnapsackAllocation(
    const std::vector<TensorChoice>& tensors,
    const std::vector<std::vector<size_t>>& options, double budget) {
  // At most 2^24 cells of the choice table (32 MiB) beyond 4096 units per
  // tensor (GradientFileLimits allows 4096 tensors).
  constexpr size_t kMaxCells = size_t{1} << 24;
  const size_t n = tensors.size();
  const size_t units =
      std::min<size_t>(size_t{1} << 16, std::max<size_t>(4096, kMaxCells / n));
  const double unit = budget / static_cast<double>(units);
  // best[k]: least error of the tensors so far within k units.
  std::vector<double> best(units + 1, 0.0), next(units + 1);
  // choice[t * (units + 1) + k]: the candidate tensor t takes within k.
  std::vector<uint16_t> choice(n * (units + 1), UINT16_MAX);
  for (size_t t = 0; t < n; ++t) {
    std::fill(next.begin(), next.end(), INFINITY);
    for (size_t c : options[t]) {
      const CandidateSummary& s = tensors[t].candidates[c];
      const double cost_units = std::ceil(s.bytes / unit);
      if (!(cost_units <= static_cast<double>(units)) || c >= UINT16_MAX) {
        continue;
      }
      const size_t cost = static_cast<size_t>(std::max(0.0, cost_units));
      for (size_t k = cost; k <= units; ++k) {
        const double e = best[k - cost] + s.ef_err_sq;
        if (e < next[k]) {
          next[k] = e;
          choice[t * (units + 1) + k] = static_cast<uint16_t>(c);
        }
      }
    }
    best.swap(next);
  }
  if (!std::isfinite(best[units])) return {};
  std::vector<size_t> pick(n);
  size_t k = units;
  for (size_t t = n; t-- > 0;) {
    const uint16_t c = choice[t * (units + 1) + k];
    pick[t] = c;
    const double cost_units = std::ceil(tensors[t].candidates[c].bytes / unit);
    k -= static_cast<size_t>(std::max(0.0, cost_units));
  }
  double bytes = 0;
  for (size_t t = 0; t < n; ++t) bytes += tensors[t].candidates[pick[t]].bytes;
  if (bytes > budget) return {};  // rounding in the units' arithmetic
  return pick;
}

}  // namespace

double BudgetBytesPerStep(double link_gbps, double step_seconds, double share) {
  return link_gbps * 1e9 / 8 * step_seconds * share;
}

absl::StatusOr<TuneResult> TuneCodecs(
    absl::Span<const CodecCandidate> candidates,
    absl::Span<const TensorMeasurement> tensors, const TunerOptions& o) {
  const bool target = o.target_error != 0;
  const bool budget = o.budget_bytes != 0;
  if (target == budget) {
    return absl::InvalidArgumentError(
        "target_error and budget_bytes are both set or both 0; expected one");
  }
  if (target && !Positive(o.target_error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_error is ", o.target_error, "; expected a finite value > 0"));
  }
  if (budget && !Positive(o.budget_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget_bytes is ", o.budget_bytes, "; expected a finite value > 0"));
  }
  if (!(o.min_saving >= 0 && o.min_saving < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_saving is ", o.min_saving, "; expected 0 <= min_saving < 1"));
  }
  size_t fp32 = candidates.size();
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (candidates[c].codec == v1::CODEC_FP32) {
      fp32 = c;
      break;
    }
  }
  if (fp32 == candidates.size()) {
    return absl::InvalidArgumentError(
        "candidates hold no fp32; expected fp32 among them");
  }
  if (tensors.empty()) {
    return absl::InvalidArgumentError("tensors is empty; expected >= 1");
  }
  const size_t windows =
      tensors[0].profiles.empty() ? 0 : tensors[0].profiles[0].size();
  if (windows == 0) {
    return absl::InvalidArgumentError(
        "tensors[0] has no profiles; expected one per candidate and window");
  }

  TuneResult r;
  r.budget_bytes = o.budget_bytes;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorMeasurement& m = tensors[t];
    if (m.profiles.size() != candidates.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", m.name, " has profiles of ", m.profiles.size(),
          " candidates; expected ", candidates.size()));
    }
    TensorChoice choice;
    choice.name = m.name;
    choice.elements = m.elements;
    for (size_t c = 0; c < candidates.size(); ++c) {
      if (m.profiles[c].size() != windows) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", m.name, ", ", candidates[c].label, " has ",
                         m.profiles[c].size(), " windows; expected ", windows));
      }
      CandidateSummary s = Summarize(m.elements, m.profiles[c]);
      s.eligible = c == fp32 ||
                   s.bytes <= (1 - o.min_saving) *
                                  static_cast<double>(Fp32Bytes(m.elements));
      choice.candidates.push_back(s);
    }
    r.fp32_bytes += static_cast<double>(Fp32Bytes(m.elements));
    r.tensors.push_back(std::move(choice));
  }

  if (target) {
    for (TensorChoice& t : r.tensors) {
      const std::vector<size_t> e = Eligible(t, fp32, o);
      if (e.size() == 1) {
        t.chosen = fp32;
        t.reason = "dense";
        continue;
      }
      ChooseWithinTarget(e, o.target_error, &t);
    }
  } else {
    std::vector<std::vector<size_t>> options;
    double cheapest = 0;
    for (TensorChoice& t : r.tensors) {
      options.push_back(Eligible(t, fp32, o));
      t.reason = options.back().size() == 1 ? "dense" : "budget";
      double least = INFINITY;
      for (size_t c : options.back()) {
        least = std::min(least, t.candidates[c].bytes);
      }
      cheapest += least;
    }
    if (cheapest > o.budget_bytes) {
      return absl::OutOfRangeError(absl::StrCat(
          "budget of ", static_cast<uint64_t>(o.budget_bytes),
          " bytes per step is below the smallest encoding of the model's "
          "tensors among the candidates, ",
          static_cast<uint64_t>(std::ceil(cheapest)), " bytes per step"));
    }
    const std::vector<size_t> greedy =
        GreedyAllocation(r.tensors, options, o.budget_bytes);
    const std::vector<size_t> knapsack =
        KnapsackAllocation(r.tensors, options, o.budget_bytes);
    // The greedy, unless the knapsack's answer errs less.
    const bool exact_better =
        !knapsack.empty() &&
        TotalErrSq(r.tensors, knapsack) < TotalErrSq(r.tensors, greedy);
    const std::vector<size_t>& pick = exact_better ? knapsack : greedy;
    for (size_t t = 0; t < r.tensors.size(); ++t) r.tensors[t].chosen = pick[t];
  }

  for (const TensorChoice& t : r.tensors) r.bytes += t.choice().bytes;
  for (size_t w = 0; w < windows; ++w) {
    double err_sq = 0, g_sq = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const CodecProfile& p = tensors[t].profiles[r.tensors[t].chosen][w];
      err_sq += p.ef_window_err_sq;
      g_sq += p.window_g_sq;
    }
    r.ef_window_error = std::max(r.ef_window_error, RelativeNorm(err_sq, g_sq));
    const size_t steps = tensors[0].profiles[0][w].steps();
    double mean = 0;
    for (size_t s = 0; s < steps; ++s) {
      double e = 0, g = 0;
      for (size_t t = 0; t < tensors.size(); ++t) {
        const CodecProfile& p = tensors[t].profiles[r.tensors[t].chosen][w];
        if (s < p.steps()) {
          e += p.err_sq[s];
          g += p.g_sq[s];
        }
      }
      mean += RelativeNorm(e, g) / static_cast<double>(steps);
    }
    r.error = std::max(r.error, mean);
  }
  return r;
}

v1::CompressionSchedule TunedSchedule(
    absl::Span<const CodecCandidate> candidates, const TuneResult& push,
    const TuneResult* pull) {
  v1::CompressionSchedule s;
  v1::SchedulePhase* phase = s.add_phases();
  phase->set_name("tuned");
  for (size_t t = 0; t < push.tensors.size(); ++t) {
    v1::TensorCodec* tc = phase->add_tensors();
    tc->set_tensor(push.tensors[t].name);
    const CodecCandidate& c = candidates[push.tensors[t].chosen];
    tc->mutable_push()->set_codec(CodecName(c.codec));
    *tc->mutable_push()->mutable_params() = c.params;
    if (pull != nullptr) {
      const CodecCandidate& d = candidates[pull->tensors[t].chosen];
      tc->mutable_pull()->set_codec(CodecName(d.codec));
      *tc->mutable_pull()->mutable_params() = d.params;
    }
  }
  return s;
}

absl::StatusOr<std::string> ScheduleToJson(const v1::CompressionSchedule& s) {
  google::protobuf::util::JsonPrintOptions jo;
  jo.preserve_proto_field_names = true;
  jo.add_whitespace = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(s, &out, jo);
  if (!st.ok()) {
    return absl::InternalError(
        absl::StrCat("schedule to JSON: ", std::string(st.message())));
  }
  return out;
}

}  // namespace pserver
