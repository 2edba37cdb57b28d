// Whole-file reads and crash-safe whole-file writes, shared by checkpoints,
// worker state and credential files.
#ifndef PSERVER_COMMON_FILE_IO_H_
#define PSERVER_COMMON_FILE_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {

// The whole file. NOT_FOUND if it does not exist, PERMISSION_DENIED if it
// may not be read, UNAVAILABLE for other I/O errors; the message names the
// path, never the contents.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Replaces `path` with `data` so that a crash at any point leaves either the
// old file or the new one: a temporary file beside it, fsync, rename, fsync
// of the folder. UNAVAILABLE (naming the step and path) on failure; the
// temporary file is removed.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

}  // namespace pserver

#endif  // PSERVER_COMMON_FILE_IO_H_
