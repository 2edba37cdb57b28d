// Gradient capture files: the raw fp32 gradients one worker computed at some
// training steps (before momentum, error feedback or compression), with the
// model layout they belong to. pserver_worker writes them
// (--capture_gradients, --capture_steps); the codec profiler
// (tests/bench/codec_profile) and the tuner read them.
//
// Format: a sequence of frames, each a u64 little-endian byte count L and
// then L bytes holding one record of common/record_io.h (magic, fields, a
// Checksum64 trailer), so a file cut short loses whole steps and the reader
// says which.
//   frame 0, magic "PSGRADH1": u32 version (1), u32 worker_id, u32 tensor
//     count T, then T times: blob name, int64 array shape (row-major, every
//     dimension >= 1; [] is a scalar).
//   frames 1.., magic "PSGRADS1", one per captured step: u64 step, u32
//     worker_id (the header's), u32 T, then T times: float array of the
//     tensor's values (as many as its shape's product), in layout order.
// Steps strictly increase through the file.
//
// Usage:
//   auto w = GradientFileWriter::Create(path, layout, worker_id);
//   (*w)->Append(step, gradient);  // flat, TotalElements(layout) floats
//   (*w)->Close();
//   absl::StatusOr<GradientCapture> c = ReadGradientFile(path);
#ifndef PSERVER_TUNE_GRADIENT_FILE_H_
#define PSERVER_TUNE_GRADIENT_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/layout.h"
#include "pserver/v1/parameter_server.pb.h"

namespace pserver {

inline constexpr uint32_t kGradientFileVersion = 1;

// What a reader accepts; anything beyond is refused before it is allocated.
struct GradientFileLimits {
  uint64_t max_file_bytes = uint64_t{4} << 30;
  uint32_t max_tensors = 4096;
  uint32_t max_name_bytes = 256;
  uint32_t max_dims = 8;
  uint64_t max_elements = kMaxModelElements;  // all tensors together
  uint64_t max_steps = 100000;
};

// One captured step: the flat gradient, tensors laid end to end in layout
// order (offsets as in ValidateLayout's slots).
struct GradientStep {
  uint64_t step = 0;
  std::vector<float> values;
};

struct GradientCapture {
  uint32_t worker_id = 0;
  v1::ModelLayout layout;
  std::vector<TensorSlot> slots;  // ValidateLayout(layout)
  std::vector<GradientStep> steps;  // increasing step
};

// Parses a whole gradient file held in memory. DATA_LOSS for a bad magic,
// checksum or a frame cut short, INVALID_ARGUMENT for a field out of range or
// inconsistent (a shape whose product is not the values' count, a step not
// above the previous one, ...), RESOURCE_EXHAUSTED past `limits`; the message
// names the frame, the field, its value and what was expected. Never aborts;
// allocates no more than `bytes` could hold.
absl::StatusOr<GradientCapture> ParseGradientFile(
    absl::string_view bytes, const GradientFileLimits& limits = {});

// Reads and parses `path` (its size checked against limits.max_file_bytes
// first). Errors as ParseGradientFile and ReadFileToString, prefixed with
// the path.
absl::StatusOr<GradientCapture> ReadGradientFile(
    const std::string& path, const GradientFileLimits& limits = {});

// The values of tensor `t` of step `s`. REQUIRES: t < c.slots.size().
absl::Span<const float> TensorValues(const GradientCapture& c,
                                     const GradientStep& s, size_t t);

// Appends steps to a new gradient file, flushing each step to the OS so that
// a worker killed mid-run leaves every complete step readable.
// Thread-compatible: one writer per file; no concurrent calls.
class GradientFileWriter {
 public:
  // Creates (truncates) `path` and writes the header. INVALID_ARGUMENT for a
  // malformed layout (as ValidateLayout); UNAVAILABLE naming the path when
  // it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<GradientFileWriter>> Create(
      const std::string& path, const v1::ModelLayout& layout,
      uint32_t worker_id);
  ~GradientFileWriter();
  GradientFileWriter(const GradientFileWriter&) = delete;
  GradientFileWriter& operator=(const GradientFileWriter&) = delete;

  // Writes one step. INVALID_ARGUMENT when gradient.size() is not the
  // layout's element count or step is not above the last one written;
  // UNAVAILABLE on a write error (the file then stops taking steps).
  absl::Status Append(uint64_t step, absl::Span<const float> gradient);
  // Closes the file; UNAVAILABLE if that fails. Later Appends fail.
  absl::Status Close();

  uint64_t steps_written() const { return steps_written_; }

 private:
  GradientFileWriter(std::string path, FILE* f,
                     std::vector<TensorSlot> slots, uint32_t worker_id)
      : path_(std::move(path)), file_(f), slots_(std::move(slots)),
        worker_id_(worker_id) {}
  absl::Status WriteFrame(const std::string& record);

  std::string path_;
  FILE* file_;  // null once closed or failed
  std::vector<TensorSlot> slots_;
  uint32_t worker_id_;
  uint64_t total_ = 0;
  uint64_t steps_written_ = 0;
  uint64_t last_step_ = 0;
};

// A set of steps given as "A-B,C,D-E" (inclusive ranges of non-negative
// integers, in increasing order, not overlapping): the worker's
// --capture_steps.
class StepRanges {
 public:
  // INVALID_ARGUMENT naming the bad part and the expected form.
  static absl::StatusOr<StepRanges> Parse(absl::string_view spec);

  bool Contains(uint64_t step) const;
  // The last step in the set. REQUIRES: the set is not empty (Parse never
  // returns an empty one).
  uint64_t last() const { return ranges_.back().second; }
  const std::vector<std::pair<uint64_t, uint64_t>>& ranges() const {
    return ranges_;
  }

 private:
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // [first, last]
};

}  // namespace pserver

#endif  // PSERVER_TUNE_GRADIENT_FILE_H_
