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
#include "common/internal/schedule_bounds.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace pserver {
namespace {

using internal::Bound;
using internal::Bounds;
using internal::PhaseLabel;
using internal::ReadBounds;

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


}  // namespace pserver
