#include "common/file_io.h"

#include <memory>

namespace pserver {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  return PosixFileSystem()->ReadFile(path);
}

absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path,
                                 absl::string_view data) {
  const std::string tmp = path + ".tmp";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs.NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  absl::Status st = (*file)->Append(data);
  if (st.ok()) st = (*file)->Sync();
  absl::Status closed = (*file)->Close();
  if (st.ok()) st = closed;
  if (st.ok()) st = fs.Rename(tmp, path);
  if (!st.ok()) {
    (void)fs.Remove(tmp);  // best effort; the first error is what matters
    return st;
  }
  // The rename is durable only once the folder is synced.
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash + 1);
  (void)fs.SyncDir(dir);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view data) {
  return WriteFileAtomically(*PosixFileSystem(), path, data);
}

}  // namespace pserver
