#include "tune/gradient_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/record_io.h"

namespace pserver {
namespace {

constexpr absl::string_view kHeaderMagic = "PSGRADH1";
constexpr absl::string_view kStepMagic = "PSGRADS1";

// Splits the next frame off `rest`: its u64 length, then that many bytes.
absl::StatusOr<absl::string_view> NextFrame(absl::string_view* rest,
                                            uint64_t index, uint64_t offset) {
  if (rest->size() < 8) {
    return absl::DataLossError(absl::StrCat(
        "frame ", index, " at byte ", offset, ": ", rest->size(),
        " bytes left; expected an 8-byte length (file truncated)"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>((*rest)[i]);
  }
  if (n > rest->size() - 8) {
    return absl::DataLossError(absl::StrCat(
        "frame ", index, " at byte ", offset, ": length is ", n, "; only ",
        rest->size() - 8, " bytes follow (file truncated)"));
  }
  absl::string_view frame = rest->substr(8, n);
  rest->remove_prefix(8 + n);
  return frame;
}

absl::Status Truncated(absl::string_view where, absl::string_view field) {
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": record ends before ", field, " (malformed record)"));
}

absl::Status ParseHeader(absl::string_view frame,
                         const GradientFileLimits& limits,
                         GradientCapture* c) {
  const absl::string_view where = "header (frame 0)";
  absl::StatusOr<RecordReader> r =
      RecordReader::Open(frame, kHeaderMagic, "gradient file header");
  if (!r.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", r.status().message()));
  }
  uint32_t version = 0, tensors = 0;
  if (!r->Num(&version)) return Truncated(where, "version");
  if (version != kGradientFileVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": version is ", version, "; expected ", kGradientFileVersion));
  }
  if (!r->Num(&c->worker_id)) return Truncated(where, "worker_id");
  if (!r->Num(&tensors)) return Truncated(where, "tensor count");
  if (tensors == 0 || tensors > limits.max_tensors) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor count is ", tensors, "; expected 1..",
                     limits.max_tensors));
  }
  // Each tensor takes at least 16 bytes (two u64 counts): a count the record
  // cannot hold is refused before anything is reserved for it.
  if (tensors > r->remaining() / 16) {
    return Truncated(where, absl::StrCat("tensor ", r->remaining() / 16));
  }
  for (uint32_t t = 0; t < tensors; ++t) {
    v1::TensorSpec* spec = c->layout.add_tensors();
    const std::string field = absl::StrCat("tensors[", t, "]");
    std::string name;
    if (!r->Blob(&name)) return Truncated(where, field + ".name");
    if (name.empty() || name.size() > limits.max_name_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, ".name is ", name.size(),
                       " bytes; expected 1..", limits.max_name_bytes));
    }
    spec->set_name(std::move(name));
    std::vector<int64_t> shape;
    if (!r->Int64s(&shape)) return Truncated(where, field + ".shape");
    if (shape.size() > limits.max_dims) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, ".shape has ", shape.size(),
                       " dimensions; expected at most ", limits.max_dims));
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] < 1 || static_cast<uint64_t>(shape[d]) > limits.max_elements) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", field, ".shape[", d, "] is ", shape[d],
            "; expected 1..", limits.max_elements));
      }
      spec->add_shape(static_cast<uint64_t>(shape[d]));
    }
  }
  if (!r->done()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", r->remaining(), " bytes after the last tensor; expected 0"));
  }
  // Names unique, element total within kMaxModelElements (no overflow).
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(c->layout);
  if (!slots.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", slots.status().message()));
  }
  c->slots = *std::move(slots);
  const uint64_t total = TotalElements(c->layout);
  if (total > limits.max_elements) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": the layout holds ", total,
                     " elements; expected at most ", limits.max_elements));
  }
  return absl::OkStatus();
}

absl::Status ParseStep(absl::string_view frame, uint64_t index,
                       GradientCapture* c) {
  const std::string where =
      absl::StrCat("step record ", index - 1, " (frame ", index, ")");
  const uint64_t total = TotalElements(c->layout);
  // Checked before the checksum pass: the frame must hold the values.
  if (frame.size() < total * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", frame.size(), " bytes; expected at least ",
        total * sizeof(float), " for ", total, " values"));
  }
  absl::StatusOr<RecordReader> r =
      RecordReader::Open(frame, kStepMagic, "gradient file step record");
  if (!r.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", r.status().message()));
  }
  GradientStep s;
  uint32_t worker = 0, tensors = 0;
  if (!r->Num(&s.step)) return Truncated(where, "step");
  if (!c->steps.empty() && s.step <= c->steps.back().step) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": step is ", s.step, "; expected > ",
                     c->steps.back().step, " (steps increase)"));
  }
  if (!r->Num(&worker)) return Truncated(where, "worker_id");
  if (worker != c->worker_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": worker_id is ", worker, "; expected ",
                     c->worker_id, " (the header's)"));
  }
  if (!r->Num(&tensors)) return Truncated(where, "tensor count");
  if (tensors != c->slots.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor count is ", tensors, "; expected ",
                     c->slots.size(), " (the header's)"));
  }
  s.values.reserve(total);
  std::vector<float> v;
  for (size_t t = 0; t < c->slots.size(); ++t) {
    const std::string field = absl::StrCat("tensors[", t, "] (", c->slots[t].name, ")");
    if (!r->Floats(&v)) return Truncated(where, field + " values");
    if (v.size() != c->slots[t].size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, " has ", v.size(),
                       " values; expected ", c->slots[t].size,
                       " (its shape's product)"));
    }
    s.values.insert(s.values.end(), v.begin(), v.end());
  }
  if (!r->done()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", r->remaining(), " bytes after the last tensor; expected 0"));
  }
  c->steps.push_back(std::move(s));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GradientCapture> ParseGradientFile(
    absl::string_view bytes, const GradientFileLimits& limits) {
  if (bytes.size() > limits.max_file_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("gradient file is ", bytes.size(),
                     " bytes; expected at most ", limits.max_file_bytes));
  }
  GradientCapture c;
  absl::string_view rest = bytes;
  absl::StatusOr<absl::string_view> frame = NextFrame(&rest, 0, 0);
  if (!frame.ok()) return frame.status();
  if (absl::Status s = ParseHeader(*frame, limits, &c); !s.ok()) return s;
  for (uint64_t index = 1; !rest.empty(); ++index) {
    if (c.steps.size() >= limits.max_steps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("frame ", index, ": more than ", limits.max_steps,
                       " steps; expected at most ", limits.max_steps));
    }
    frame = NextFrame(&rest, index, bytes.size() - rest.size());
    if (!frame.ok()) return frame.status();
    if (absl::Status s = ParseStep(*frame, index, &c); !s.ok()) return s;
  }
  return c;
}

absl::StatusOr<GradientCapture> ReadGradientFile(
    const std::string& path, const GradientFileLimits& limits) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && st.st_size >= 0 &&
      static_cast<uint64_t>(st.st_size) > limits.max_file_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": ", st.st_size, " bytes; expected at most ",
                     limits.max_file_bytes));
  }
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<GradientCapture> c = ParseGradientFile(*bytes, limits);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat(path, ": ", c.status().message()));
  }
  return c;
}

absl::Span<const float> TensorValues(const GradientCapture& c,
                                     const GradientStep& s, size_t t) {
  return absl::MakeConstSpan(s.values).subspan(c.slots[t].offset,
                                               c.slots[t].size);
}

absl::StatusOr<std::unique_ptr<GradientFileWriter>> GradientFileWriter::Create(
    const std::string& path, const v1::ModelLayout& layout,
    uint32_t worker_id) {
  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(layout);
  if (!slots.ok()) return slots.status();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create gradient file ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<GradientFileWriter> w(
      new GradientFileWriter(path, f, *std::move(slots), worker_id));
  w->total_ = TotalElements(layout);
  RecordWriter r(kHeaderMagic);
  r.Num<uint32_t>(kGradientFileVersion);
  r.Num<uint32_t>(worker_id);
  r.Num<uint32_t>(static_cast<uint32_t>(layout.tensors_size()));
  for (const v1::TensorSpec& t : layout.tensors()) {
    r.Blob(t.name());
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    r.Int64s(shape);
  }
  if (absl::Status s = w->WriteFrame(std::move(r).Finish()); !s.ok()) return s;
  return w;
}

GradientFileWriter::~GradientFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status GradientFileWriter::WriteFrame(const std::string& record) {
  if (file_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("gradient file ", path_, " is closed"));
  }
  unsigned char len[8];
  uint64_t n = record.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, file_) != 8 ||
      std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    const int err = errno;
    std::fclose(file_);
    file_ = nullptr;
    return absl::UnavailableError(absl::StrCat(
        "writing gradient file ", path_, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status GradientFileWriter::Append(uint64_t step,
                                        absl::Span<const float> gradient) {
  if (gradient.size() != total_) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient has ", gradient.size(), " elements; expected ",
                     total_, " (the layout's)"));
  }
  if (steps_written_ > 0 && step <= last_step_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step is ", step, "; expected > ", last_step_, " (steps increase)"));
  }
  RecordWriter r(kStepMagic);
  r.Num<uint64_t>(step);
  r.Num<uint32_t>(worker_id_);
  r.Num<uint32_t>(static_cast<uint32_t>(slots_.size()));
  for (const TensorSlot& s : slots_) {
    r.Floats(gradient.subspan(s.offset, s.size));
  }
  if (absl::Status s = WriteFrame(std::move(r).Finish()); !s.ok()) return s;
  last_step_ = step;
  ++steps_written_;
  return absl::OkStatus();
}

absl::Status GradientFileWriter::Close() {
  if (file_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("gradient file ", path_, " is already closed"));
  }
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "closing gradient file ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepRanges> StepRanges::Parse(absl::string_view spec) {
  constexpr absl::string_view kForm =
      "expected increasing steps or ranges like 0-19,1000-1019";
  StepRanges out;
  if (spec.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("is empty; ", kForm));
  }
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    std::pair<absl::string_view, absl::string_view> ends =
        absl::StrSplit(part, absl::MaxSplits('-', 1));
    uint64_t first = 0, last = 0;
    const bool range = part.find('-') != absl::string_view::npos;
    // SimpleAtoi takes a sign; a step never has one.
    auto digits = [](absl::string_view s) {
      return !s.empty() && s.find_first_not_of("0123456789") == s.npos;
    };
    if (!digits(ends.first) || !absl::SimpleAtoi(ends.first, &first) ||
        (range && (!digits(ends.second) ||
                   !absl::SimpleAtoi(ends.second, &last)))) {
      return absl::InvalidArgumentError(
          absl::StrCat("has '", part, "'; ", kForm));
    }
    if (!range) last = first;
    if (last < first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "has '", part, "', a range that ends before it starts; ", kForm));
    }
    if (!out.ranges_.empty() && first <= out.ranges_.back().second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "has '", part, "', which does not start after step ",
          out.ranges_.back().second, "; ", kForm));
    }
    out.ranges_.emplace_back(first, last);
  }
  return out;
}

bool StepRanges::Contains(uint64_t step) const {
  for (const auto& [first, last] : ranges_) {
    if (step >= first && step <= last) return true;
    if (step < first) return false;
  }
  return false;
}

}  // namespace pserver
