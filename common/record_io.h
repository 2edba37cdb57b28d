// One on-disk record format, shared by shard checkpoints and worker state
// files: a fixed magic, then fields appended in order, then a u64 Checksum64
// of every byte before it (magic included). All numbers are little-endian;
// blob = u64 length + bytes; array = u64 count + values.
//
// Usage:
//   RecordWriter w(kMagic);
//   w.Num<uint32_t>(version);
//   w.Floats(x);
//   std::string bytes = std::move(w).Finish();
//
//   absl::StatusOr<RecordReader> r = RecordReader::Open(bytes, kMagic, "x");
//   if (!r.ok()) return r.status();        // DATA_LOSS: magic or checksum
//   if (!r->Num(&version) || !r->Floats(&x)) ...  // truncated
//
// Thread-compatible: one instance per record; no concurrent calls.
#ifndef PSERVER_COMMON_RECORD_IO_H_
#define PSERVER_COMMON_RECORD_IO_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pserver {

class RecordWriter {
 public:
  // Starts the record with `magic` (may contain NUL bytes).
  explicit RecordWriter(absl::string_view magic);

  // Appends v as sizeof(T) little-endian bytes. T: a fixed-width integer or
  // float.
  template <typename T>
  void Num(T v) {
    static_assert(std::is_integral<T>::value || std::is_same<T, float>::value,
                  "Num takes fixed-width integers and float");
    AppendLittleEndian(&v, sizeof(T), 1);
  }
  void Blob(absl::string_view s);
  void Floats(absl::Span<const float> v);
  void Int64s(absl::Span<const int64_t> v);

  // Appends the checksum trailer and returns the record.
  std::string Finish() &&;

 private:
  // Appends `count` values of `width` bytes each, in little-endian order.
  void AppendLittleEndian(const void* p, size_t width, size_t count);

  std::string out_;
};

// Bounds-checked reading of untrusted bytes. Every Get-style call returns
// false (and reads nothing more) once the input is exhausted; no call
// allocates more than the bytes left in the input could hold.
class RecordReader {
 public:
  // DATA_LOSS when `bytes` does not start with `magic` or its trailer does
  // not match; the message names `what` ("pserver checkpoint", ...). The
  // reader then stands just after the magic and stops before the trailer.
  // `bytes` must outlive the reader.
  static absl::StatusOr<RecordReader> Open(absl::string_view bytes,
                                           absl::string_view magic,
                                           absl::string_view what);

  template <typename T>
  bool Num(T* v) {
    static_assert(std::is_integral<T>::value || std::is_same<T, float>::value,
                  "Num takes fixed-width integers and float");
    return ReadLittleEndian(v, sizeof(T), 1);
  }
  bool Blob(std::string* s);
  bool Floats(std::vector<float>* v);
  bool Int64s(std::vector<int64_t>* v);

  size_t remaining() const { return in_.size() - pos_; }
  bool done() const { return pos_ == in_.size(); }

 private:
  explicit RecordReader(absl::string_view in) : in_(in) {}
  bool ReadLittleEndian(void* p, size_t width, size_t count);
  // Reads a u64 count of `width`-byte values and checks the input holds them.
  bool Count(size_t width, uint64_t* n);

  absl::string_view in_;
  size_t pos_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_COMMON_RECORD_IO_H_
