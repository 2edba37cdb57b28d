#include "common/schedule.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace pserver {
namespace {

// Collects the text-format parser's complaints (it prints them otherwise).
class ParseErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) {
      first_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ",
                            message);
    }
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// A bound of a phase, in the units the file gave.
struct Bound {
  bool fraction = false;
  uint64_t step = 0;
  double value = 0;  // the fraction

  uint64_t Resolve(uint64_t total) const {
    if (!fraction) return step;
    // floor(f * total), exact for the fractions people write (0.1 of 9370).
    return static_cast<uint64_t>(
        std::floor(value * static_cast<double>(total) + 1e-9));
  }
  std::string Describe() const {
    return fraction ? absl::StrCat("fraction ", value)
                    : absl::StrCat("step ", step);
  }
};

std::string PhaseLabel(const v1::CompressionSchedule& s, size_t i) {
  const std::string& name = s.phases(static_cast<int>(i)).name();
  return name.empty() ? absl::StrCat("phase ", i)
                      : absl::StrCat("phase ", i, " (\"", name, "\")");
}

absl::StatusOr<std::optional<Bound>> ReadBound(bool has_step, uint64_t step,
                                               bool has_fraction,
                                               double fraction,
                                               const char* what) {
  if (has_step && has_fraction) {
    return absl::InvalidArgumentError(absl::StrCat(
        "both ", what, "_step and ", what, "_fraction are set; expected one"));
  }
  if (has_fraction) {
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "_fraction is ", fraction, "; expected 0..1"));
    }
    return std::optional<Bound>(Bound{true, 0, fraction});
  }
  if (has_step) return std::optional<Bound>(Bound{false, step, 0});
  return std::optional<Bound>();
}

absl::StatusOr<std::unique_ptr<CodecChoiceSpec>> BuildChoice(
    const v1::CodecChoice& c) {
  absl::StatusOr<v1::Codec> id = ParseCodecName(c.codec());
  if (!id.ok()) {
    return absl::InvalidArgumentError(
        c.codec().empty() ? std::string("codec is missing; expected a codec "
                                        "name such as \"quantize\"")
                          : std::string(id.status().message()));
  }
  absl::StatusOr<std::unique_ptr<Codec>> built = MakeCodec(*id, c.params());
  if (!built.ok()) return built.status();
  auto spec = std::make_unique<CodecChoiceSpec>();
  spec->codec = *id;
  spec->params = c.params();
  spec->encoder = std::shared_ptr<const Codec>(std::move(built).value());
  return spec;
}

// The bounds of every phase: begins[i] and, where given, ends[i].
struct Bounds {
  std::vector<Bound> begins;
  std::vector<std::optional<Bound>> ends;
};

absl::StatusOr<Bounds> ReadBounds(const v1::CompressionSchedule& s) {
  Bounds b;
  for (int i = 0; i < s.phases_size(); ++i) {
    const v1::SchedulePhase& p = s.phases(i);
    auto fail = [&](const absl::Status& st) {
      return absl::InvalidArgumentError(
          absl::StrCat(PhaseLabel(s, i), ": ", st.message()));
    };
    absl::StatusOr<std::optional<Bound>> begin =
        ReadBound(p.has_begin_step(), p.begin_step(), p.has_begin_fraction(),
                  p.begin_fraction(), "begin");
    if (!begin.ok()) return fail(begin.status());
    absl::StatusOr<std::optional<Bound>> end =
        ReadBound(p.has_end_step(), p.end_step(), p.has_end_fraction(),
                  p.end_fraction(), "end");
    if (!end.ok()) return fail(end.status());
    if (!begin->has_value()) {
      if (i != 0) {
        return fail(absl::InvalidArgumentError(
            "begin is missing; expected begin_step or begin_fraction (only "
            "the first phase may leave it out)"));
      }
      *begin = Bound{};  // step 0
    }
    if (i == 0 && ((*begin)->fraction ? (*begin)->value != 0.0
                                      : (*begin)->step != 0)) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "begins at ", (*begin)->Describe(),
          "; expected the first phase to begin at step 0 (no rounds may be "
          "left without a phase)")));
    }
    b.begins.push_back(**begin);
    b.ends.push_back(*end);
  }
  // What can be checked before the run's length is known: bounds in the
  // same units must increase, and an end must be the next phase's begin.
  for (size_t i = 0; i + 1 < b.begins.size(); ++i) {
    const Bound& a = b.begins[i];
    const Bound& n = b.begins[i + 1];
    if (a.fraction == n.fraction &&
        (a.fraction ? !(n.value > a.value) : !(n.step > a.step))) {
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i + 1), ": begins at ", n.Describe(), ", not after ",
          PhaseLabel(s, i), "'s begin (", a.Describe(),
          "); expected phases in increasing order of their begin"));
    }
  }
  for (size_t i = 0; i < b.ends.size(); ++i) {
    if (!b.ends[i].has_value()) continue;
    const Bound& e = *b.ends[i];
    if (i + 1 == b.begins.size()) {
      if (!(e.fraction ? e.value == 1.0 : false)) {
        return absl::InvalidArgumentError(absl::StrCat(
            PhaseLabel(s, i), ": the last phase ends at ", e.Describe(),
            "; expected it to run to the end of the run (leave the end out, "
            "or end_fraction: 1)"));
      }
      continue;
    }
    const Bound& n = b.begins[i + 1];
    if (e.fraction == n.fraction &&
        (e.fraction ? e.value != n.value : e.step != n.step)) {
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i), ": ends at ", e.Describe(), " but ",
          PhaseLabel(s, i + 1), " begins at ", n.Describe(), "; expected ",
          e.fraction ? (e.value < n.value ? "no gap" : "no overlap")
                     : (e.step < n.step ? "no gap" : "no overlap"),
          " between phases (an end equal to the next begin)"));
    }
  }
  return b;
}

}  // namespace

std::string CodecChoiceSpec::Describe() const {
  std::string out = CodecName(codec);
  const v1::CodecParams& p = encoder->params();
  switch (codec) {
    case v1::CODEC_ONEBIT:
      absl::StrAppend(&out, " block=", p.block_size());
      break;
    case v1::CODEC_QUANTIZE:
      absl::StrAppend(&out, " bits=", p.bits(), " block=", p.block_size(),
                      p.rounding() == v1::ROUNDING_STOCHASTIC ? " stochastic"
                                                              : "",
                      p.range() == v1::QUANTIZE_RANGE_ADAPTIVE ? " adaptive"
                                                               : "");
      break;
    case v1::CODEC_TOPK:
    case v1::CODEC_RANDOMK:
      absl::StrAppend(&out, " k_fraction=", p.k_fraction());
      break;
    case v1::CODEC_BLOCK_TOPK:
      absl::StrAppend(&out, " block=", p.block_size(), " k_fraction=",
                      p.k_fraction());
      break;
    case v1::CODEC_TOPK_QUANTIZE:
      absl::StrAppend(&out, " k_fraction=", p.k_fraction(), " bits=",
                      p.bits());
      break;
    default:
      break;
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const CompressionSchedule>>
CompressionSchedule::Parse(absl::string_view text, absl::string_view source) {
  auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  if (text.size() > kMaxScheduleFileBytes) {
    return fail(absl::StrCat("is ", text.size(), " bytes; expected at most ",
                             kMaxScheduleFileBytes));
  }
  v1::CompressionSchedule proto;
  absl::string_view body = absl::StripLeadingAsciiWhitespace(text);
  if (!body.empty() && body.front() == '{') {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    auto st = google::protobuf::util::JsonStringToMessage(
        google::protobuf::StringPiece(body.data(), body.size()), &proto,
        options);
    if (!st.ok()) {
      return fail(absl::StrCat("not a valid schedule (JSON): ",
                               std::string(st.message())));
    }
  } else {
    google::protobuf::TextFormat::Parser parser;
    ParseErrors errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(std::string(text), &proto)) {
      return fail(absl::StrCat("not a valid schedule (text format): ",
                               errors.first()));
    }
  }
  if (proto.phases_size() == 0) {
    return fail("has no phases; expected 1 to 64");
  }
  if (proto.phases_size() > kMaxSchedulePhases) {
    return fail(absl::StrCat("has ", proto.phases_size(),
                             " phases; expected at most ",
                             kMaxSchedulePhases));
  }
  absl::StatusOr<Bounds> bounds = ReadBounds(proto);
  if (!bounds.ok()) return fail(bounds.status().message());

  std::shared_ptr<CompressionSchedule> s(new CompressionSchedule());
  for (int i = 0; i < proto.phases_size(); ++i) {
    const v1::SchedulePhase& p = proto.phases(i);
    Phase phase;
    for (auto [has, choice, out, what] :
         {std::tuple{p.has_push(), &p.push(), &phase.push, "push"},
          std::tuple{p.has_pull(), &p.pull(), &phase.pull, "pull"}}) {
      if (!has) continue;
      absl::StatusOr<std::unique_ptr<CodecChoiceSpec>> c = BuildChoice(*choice);
      if (!c.ok()) {
        return fail(absl::StrCat(PhaseLabel(proto, i), " ", what, ": ",
                                 c.status().message()));
      }
      *out = *std::move(c);
    }
    if (p.tensors_size() > kMaxTensorCodecs) {
      return fail(absl::StrCat(PhaseLabel(proto, i), ": has ",
                               p.tensors_size(),
                               " tensors entries; expected at most ",
                               kMaxTensorCodecs));
    }
    absl::flat_hash_set<std::string> names;
    for (int t = 0; t < p.tensors_size(); ++t) {
      const v1::TensorCodec& tc = p.tensors(t);
      const std::string where =
          absl::StrCat(PhaseLabel(proto, i), " tensors[", t, "]");
      if (tc.tensor().empty()) {
        return fail(absl::StrCat(
            where, ": tensor is missing; expected a tensor name of the "
                   "model's layout"));
      }
      if (!names.insert(tc.tensor()).second) {
        return fail(absl::StrCat(where, ": tensor \"", tc.tensor(),
                                 "\" appears twice; expected each tensor "
                                 "once per phase"));
      }
      TensorChoice choice;
      choice.name = tc.tensor();
      for (auto [has, c, out, what] :
           {std::tuple{tc.has_push(), &tc.push(), &choice.push, "push"},
            std::tuple{tc.has_pull(), &tc.pull(), &choice.pull, "pull"}}) {
        if (!has) continue;
        absl::StatusOr<std::unique_ptr<CodecChoiceSpec>> built =
            BuildChoice(*c);
        if (!built.ok()) {
          return fail(absl::StrCat(where, " ", what, ": ",
                                   built.status().message()));
        }
        *out = *std::move(built);
      }
      if (choice.push == nullptr && choice.pull == nullptr) {
        return fail(absl::StrCat(where, " (\"", tc.tensor(),
                                 "\"): neither push nor pull is set; "
                                 "expected at least one codec"));
      }
      s->has_tensor_codecs_ = true;
      s->has_tensor_pulls_ |= choice.pull != nullptr;
      phase.tensors.push_back(std::move(choice));
    }
    s->phases_.push_back(std::move(phase));
  }
  for (const Bound& b : bounds->begins) s->uses_fractions_ |= b.fraction;
  for (const auto& e : bounds->ends) {
    s->uses_fractions_ |= e.has_value() && e->fraction && e->value < 1.0;
  }
  std::string canonical;
  google::protobuf::io::StringOutputStream stream(&canonical);
  {
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    proto.SerializeToCodedStream(&out);
  }
  Checksum64 h;
  h.Update(canonical.data(), canonical.size());
  s->fingerprint_ = std::max<uint64_t>(h.Finish(), 1);
  s->proto_ = std::move(proto);
  return std::shared_ptr<const CompressionSchedule>(std::move(s));
}

absl::StatusOr<std::shared_ptr<const CompressionSchedule>>
CompressionSchedule::Load(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read the schedule file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is not a regular file; expected a schedule"));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxScheduleFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is ", st.st_size, " bytes; expected at most ",
                     kMaxScheduleFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text;
  // Read at most one byte more than allowed (the file may have grown).
  text.resize(kMaxScheduleFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read the schedule file"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  return Parse(text, path);
}

const CodecChoiceSpec* CompressionSchedule::push(size_t phase) const {
  return phases_[phase].push.get();
}

const CodecChoiceSpec* CompressionSchedule::pull(size_t phase) const {
  return phases_[phase].pull.get();
}

absl::Status CompressionSchedule::CheckTensors(
    const std::vector<TensorSlot>& slots) const {
  absl::flat_hash_set<absl::string_view> known;
  for (const TensorSlot& slot : slots) known.insert(slot.name);
  for (size_t i = 0; i < phases_.size(); ++i) {
    const std::vector<TensorChoice>& tensors = phases_[i].tensors;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (known.contains(tensors[t].name)) continue;
      std::vector<absl::string_view> names;
      for (const TensorSlot& slot : slots) {
        if (names.size() == 8) {
          names.push_back("...");
          break;
        }
        names.push_back(slot.name);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(proto_, i), " tensors[", t, "]: tensor \"",
          tensors[t].name, "\" is not in the model's layout; expected one of ",
          absl::StrJoin(names, ", ")));
    }
  }
  return absl::OkStatus();
}

std::vector<const Codec*> CompressionSchedule::TensorCodecs(
    size_t phase, const std::vector<TensorSlot>& slots, bool pull) const {
  std::vector<const Codec*> out(slots.size(), nullptr);
  const std::vector<TensorChoice>& tensors = phases_[phase].tensors;
  if (tensors.empty()) return out;
  absl::flat_hash_map<absl::string_view, const CodecChoiceSpec*> by_name;
  for (const TensorChoice& t : tensors) {
    const CodecChoiceSpec* c = pull ? t.pull.get() : t.push.get();
    if (c != nullptr) by_name[t.name] = c;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    auto it = by_name.find(slots[i].name);
    if (it != by_name.end()) out[i] = it->second->encoder.get();
  }
  return out;
}

std::vector<const Codec*> CompressionSchedule::TensorPushCodecs(
    size_t phase, const std::vector<TensorSlot>& slots) const {
  return TensorCodecs(phase, slots, /*pull=*/false);
}

std::vector<const Codec*> CompressionSchedule::TensorPullCodecs(
    size_t phase, const std::vector<TensorSlot>& slots) const {
  return TensorCodecs(phase, slots, /*pull=*/true);
}

std::string CompressionSchedule::PhaseName(size_t phase) const {
  const std::string& name = proto_.phases(static_cast<int>(phase)).name();
  return name.empty() ? absl::StrCat("phase ", phase) : name;
}

absl::StatusOr<ResolvedSchedule> ResolvedSchedule::Make(
    std::shared_ptr<const CompressionSchedule> schedule,
    uint64_t total_steps) {
  const v1::CompressionSchedule& s = schedule->proto();
  if (schedule->uses_fractions() && total_steps == 0) {
    return absl::InvalidArgumentError(
        "total_steps is 0; expected the run's length in rounds (the "
        "schedule bounds phases by fractions of the run)");
  }
  // Parse validated the bounds' form; only the resolved order is new.
  absl::StatusOr<Bounds> bounds = ReadBounds(s);
  if (!bounds.ok()) return bounds.status();
  ResolvedSchedule r;
  r.schedule_ = std::move(schedule);
  r.total_steps_ = total_steps;
  for (size_t i = 0; i < bounds->begins.size(); ++i) {
    const uint64_t b = bounds->begins[i].Resolve(total_steps);
    if (i > 0 && b <= r.begins_.back()) {
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i), " begins at ", bounds->begins[i].Describe(),
          " = round ", b, " of ", total_steps, ", not after ",
          PhaseLabel(s, i - 1), "'s round ", r.begins_.back(),
          "; expected every phase to have at least one round"));
    }
    if (i > 0 && bounds->ends[i - 1].has_value() &&
        bounds->ends[i - 1]->Resolve(total_steps) != b) {
      const uint64_t e = bounds->ends[i - 1]->Resolve(total_steps);
      return absl::InvalidArgumentError(absl::StrCat(
          PhaseLabel(s, i - 1), " ends at round ", e, " but ",
          PhaseLabel(s, i), " begins at round ", b, " (of ", total_steps,
          "); expected ", e < b ? "no gap" : "no overlap",
          " between phases"));
    }
    r.begins_.push_back(b);
  }
  return r;
}

size_t ResolvedSchedule::PhaseAt(uint64_t step) const {
  auto it = std::upper_bound(begins_.begin(), begins_.end(), step);
  return it == begins_.begin() ? 0
                               : static_cast<size_t>(it - begins_.begin()) - 1;
}

}  // namespace pserver
