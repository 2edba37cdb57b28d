// Whole-file reads and crash-safe whole-file writes, shared by checkpoints,
// worker state and credential files.
#ifndef PSERVER_COMMON_FILE_IO_H_
#define PSERVER_COMMON_FILE_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"

namespace pserver {

// The whole file, from PosixFileSystem(). NOT_FOUND if it does not exist,
// PERMISSION_DENIED if it may not be read, UNAVAILABLE for other I/O errors;
// the message names the path, never the contents.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Replaces `path` with `data` so that a crash at any point leaves either the
// old file or the new one: a temporary file `path`.tmp beside it, fsync,
// rename, fsync of the folder. On failure the error of the step that failed
// (naming it and the path) and the temporary file is removed; `path` is
// untouched. A failed fsync of the folder is not reported: the rename has
// happened, and the caller could not undo it.
absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path,
                                 absl::string_view data);
// The same on PosixFileSystem().
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data);

}  // namespace pserver

#endif  // PSERVER_COMMON_FILE_IO_H_
