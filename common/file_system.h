// The file-system operations that checkpoints and state files need, behind
// an interface so tests can inject faults (short writes, failed renames,
// fsync errors) through a wrapper instead of editing the code under test or
// killing processes. The crash-safe whole-file write built on these lives in
// common/file_io.h.
//
// Every error names the operation and the path ("rename /a/b.tmp: ..."):
// NOT_FOUND for a missing file, PERMISSION_DENIED when access is refused,
// UNAVAILABLE for other I/O errors. Messages never contain file contents.
#ifndef PSERVER_COMMON_FILE_SYSTEM_H_
#define PSERVER_COMMON_FILE_SYSTEM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {

// A file open for writing. Thread-compatible. The destructor closes the file
// if Close() was not called, ignoring errors.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all of `data` or fails (a partial write is an error).
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes what was appended durable (fsync).
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

// Thread-safe: implementations may be called from any thread concurrently.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The whole file.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Creates `path`, or truncates it if it exists.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)).
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  // Makes the folder's entries (a rename into it) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Entry names in `dir`, without "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // Creates `dir` (one level); OK if it already exists.
  virtual absl::Status MakeDir(const std::string& dir) = 0;
};

// The real file system (POSIX calls). Stateless; never deleted.
FileSystem* PosixFileSystem();

// Forwards every call to `target` (which must outlive it); fault-injecting
// tests override only the calls they break.
class FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(FileSystem* target) : target_(target) {}

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return target_->ReadFile(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return target_->Rename(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    return target_->SyncDir(dir);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override {
    return target_->ListDir(dir);
  }
  absl::Status Remove(const std::string& path) override {
    return target_->Remove(path);
  }
  absl::Status MakeDir(const std::string& dir) override {
    return target_->MakeDir(dir);
  }

 protected:
  FileSystem* target() const { return target_; }

 private:
  FileSystem* const target_;
};

}  // namespace pserver

#endif  // PSERVER_COMMON_FILE_SYSTEM_H_
