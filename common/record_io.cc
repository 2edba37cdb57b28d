#include "common/record_io.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"

namespace pserver {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "record files are little-endian, as this host must be");

constexpr size_t kTrailer = sizeof(uint64_t);

// Copies `count` values of `width` bytes: the file and the host are both
// little-endian (asserted above), so values are copied as they are.
void CopyValues(char* dst, const char* src, size_t width, size_t count) {
  if (count == 0) return;  // src may be null for an empty span
  std::memcpy(dst, src, width * count);
}

}  // namespace

RecordWriter::RecordWriter(absl::string_view magic)
    : out_(magic.data(), magic.size()) {}

void RecordWriter::AppendLittleEndian(const void* p, size_t width,
                                      size_t count) {
  if (count == 0) return;
  const size_t at = out_.size();
  out_.resize(at + width * count);
  CopyValues(&out_[at], static_cast<const char*>(p), width, count);
}

void RecordWriter::Blob(absl::string_view s) {
  Num<uint64_t>(s.size());
  out_.append(s.data(), s.size());
}

void RecordWriter::Floats(absl::Span<const float> v) {
  Num<uint64_t>(v.size());
  AppendLittleEndian(v.data(), sizeof(float), v.size());
}

void RecordWriter::Int64s(absl::Span<const int64_t> v) {
  Num<uint64_t>(v.size());
  AppendLittleEndian(v.data(), sizeof(int64_t), v.size());
}

std::string RecordWriter::Finish() && {
  Checksum64 h;
  h.Update(out_.data(), out_.size());
  Num<uint64_t>(h.Finish());
  return std::move(out_);
}

absl::StatusOr<RecordReader> RecordReader::Open(absl::string_view bytes,
                                                absl::string_view magic,
                                                absl::string_view what) {
  if (bytes.size() < magic.size() + kTrailer ||
      bytes.substr(0, magic.size()) != magic) {
    return absl::DataLossError(absl::StrCat("not a ", what, " (magic \"",
                                            absl::CHexEscape(magic),
                                            "\" missing)"));
  }
  const absl::string_view body = bytes.substr(0, bytes.size() - kTrailer);
  RecordReader trailer(bytes.substr(body.size()));
  uint64_t stored = 0;
  trailer.Num(&stored);
  Checksum64 h;
  h.Update(body.data(), body.size());
  if (h.Finish() != stored) {
    return absl::DataLossError(absl::StrCat(
        "checksum mismatch: the ", what, " is truncated or corrupt"));
  }
  return RecordReader(body.substr(magic.size()));
}

bool RecordReader::ReadLittleEndian(void* p, size_t width, size_t count) {
  // count * width cannot overflow: callers bound count by remaining() first.
  if (count > remaining() / width) return false;
  CopyValues(static_cast<char*>(p), in_.data() + pos_, width, count);
  pos_ += width * count;
  return true;
}

bool RecordReader::Count(size_t width, uint64_t* n) {
  return Num(n) && *n <= remaining() / width;
}

bool RecordReader::Blob(std::string* s) {
  uint64_t n;
  if (!Count(1, &n)) return false;
  s->assign(in_.data() + pos_, n);
  pos_ += n;
  return true;
}

bool RecordReader::Floats(std::vector<float>* v) {
  uint64_t n;
  if (!Count(sizeof(float), &n)) return false;
  v->resize(n);
  return ReadLittleEndian(v->data(), sizeof(float), n);
}

bool RecordReader::Int64s(std::vector<int64_t>* v) {
  uint64_t n;
  if (!Count(sizeof(int64_t), &n)) return false;
  v->resize(n);
  return ReadLittleEndian(v->data(), sizeof(int64_t), n);
}

}  // namespace pserver
