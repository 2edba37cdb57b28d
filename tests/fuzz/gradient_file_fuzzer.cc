// libFuzzer target: the gradient capture file reader, ParseGradientFile
// (tune/gradient_file.h), on raw file bytes.
//
// Checked beyond "no crash, no UB": whatever it accepts is consistent (a
// valid layout, one value per element of it in every step, steps strictly
// increasing) and, written again with GradientFileWriter, reads back the
// same.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tune/gradient_file.h"
#include "common/layout.h"

namespace pserver {
namespace fuzz {
namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// One scratch file per process.
const std::string& ScratchPath() {
  static const std::string* path = [] {
    const char* tmp = std::getenv("TMPDIR");
    return new std::string(std::string(tmp && *tmp ? tmp : "/tmp") +
                           "/pserver-gradient-fuzz-" +
                           std::to_string(::getpid()));
  }();
  return *path;
}

void Run(const uint8_t* data, size_t size) {
  GradientFileLimits limits;
  limits.max_file_bytes = 1 << 20;
  absl::StatusOr<GradientCapture> c = ParseGradientFile(
      absl::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!c.ok()) return;
  Check(ValidateLayout(c->layout).ok());
  const uint64_t total = TotalElements(c->layout);
  for (size_t i = 0; i < c->steps.size(); ++i) {
    Check(c->steps[i].values.size() == total);
    if (i > 0) Check(c->steps[i].step > c->steps[i - 1].step);
  }
  auto w = GradientFileWriter::Create(ScratchPath(), c->layout, c->worker_id);
  if (!w.ok()) return;  // the scratch folder is not writable: nothing to check
  for (const GradientStep& s : c->steps) {
    Check((*w)->Append(s.step, s.values).ok());
  }
  Check((*w)->Close().ok());
  absl::StatusOr<GradientCapture> again = ReadGradientFile(ScratchPath());
  ::unlink(ScratchPath().c_str());
  Check(again.ok());
  Check(again->worker_id == c->worker_id);
  Check(FirstLayoutDifference(again->layout, c->layout).empty());
  Check(again->steps.size() == c->steps.size());
  for (size_t i = 0; i < c->steps.size(); ++i) {
    Check(again->steps[i].step == c->steps[i].step);
    // Bitwise: NaN payloads are data here too.
    Check(again->steps[i].values.size() == c->steps[i].values.size());
    Check(std::memcmp(again->steps[i].values.data(), c->steps[i].values.data(),
                      c->steps[i].values.size() * sizeof(float)) == 0);
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace pserver

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pserver::fuzz::Run(data, size);
  return 0;
}
