// Test only: a FileSystem that breaks on request, for the failures a crash
// test cannot aim at (a disk that fills up half-way through a write, a
// rename or an fsync that fails). Everything not broken reaches the wrapped
// file system, so what a failure leaves on disk is real.
//
// Usage:
//   FaultFileSystem fs(PosixFileSystem());
//   fs.FailWriteShort(1);   // the next Append writes half and fails
//   EXPECT_FALSE(WriteCheckpoint(dir, state, 2, &fs).ok());
//
// Thread-safe: the knobs and counters are under one mutex.
#ifndef PSERVER_TESTS_COMMON_FAULT_FILE_SYSTEM_H_
#define PSERVER_TESTS_COMMON_FAULT_FILE_SYSTEM_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"

namespace pserver {
namespace testing_util {

class FaultFileSystem : public FileSystemWrapper {
 public:
  explicit FaultFileSystem(FileSystem* target) : FileSystemWrapper(target) {}

  // The n-th Append from now (1 = the next one) writes only the first half
  // of its data, then fails as a full disk would. 0 disarms.
  void FailWriteShort(int n) {
    absl::MutexLock l(&mu_);
    short_write_in_ = n;
  }
  // While set, every Rename (FailRename), file Sync (FailSync) or folder
  // sync (FailSyncDir) fails without effect.
  void FailRename(bool fail) {
    absl::MutexLock l(&mu_);
    fail_rename_ = fail;
  }
  void FailSync(bool fail) {
    absl::MutexLock l(&mu_);
    fail_sync_ = fail;
  }
  void FailSyncDir(bool fail) {
    absl::MutexLock l(&mu_);
    fail_sync_dir_ = fail;
  }
  // How many faults were injected so far (a test checks its fault was hit).
  int faults() const {
    absl::MutexLock l(&mu_);
    return faults_;
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> f =
        target()->NewWritableFile(path);
    if (!f.ok()) return f;
    return std::unique_ptr<WritableFile>(
        new FaultFile(this, path, std::move(f).value()));
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (Fault(Knob::kRename)) {
      return absl::UnavailableError(
          absl::StrCat("rename ", from, ": injected failure"));
    }
    return target()->Rename(from, to);
  }

  absl::Status SyncDir(const std::string& dir) override {
    if (Fault(Knob::kSyncDir)) {
      return absl::UnavailableError(absl::StrCat("fsync ", dir, ": injected failure"));
    }
    return target()->SyncDir(dir);
  }

 private:
  enum class Knob { kRename, kSync, kSyncDir };

  class FaultFile : public WritableFile {
   public:
    FaultFile(FaultFileSystem* fs, std::string path,
              std::unique_ptr<WritableFile> file)
        : fs_(fs), path_(std::move(path)), file_(std::move(file)) {}
    absl::Status Append(absl::string_view data) override {
      if (!fs_->ShortWriteNow()) return file_->Append(data);
      (void)file_->Append(data.substr(0, data.size() / 2));
      return absl::UnavailableError(absl::StrCat(
          "write ", path_, ": injected short write (", data.size() / 2, " of ",
          data.size(), " bytes)"));
    }
    absl::Status Sync() override {
      if (fs_->Fault(Knob::kSync)) {
        return absl::UnavailableError(
            absl::StrCat("fsync ", path_, ": injected failure"));
      }
      return file_->Sync();
    }
    absl::Status Close() override { return file_->Close(); }

   private:
    FaultFileSystem* const fs_;
    const std::string path_;
    std::unique_ptr<WritableFile> file_;
  };

  // Whether the knob is set; counts the fault if so.
  bool Fault(Knob k) {
    absl::MutexLock l(&mu_);
    const bool on = k == Knob::kRename ? fail_rename_
                    : k == Knob::kSync ? fail_sync_
                                       : fail_sync_dir_;
    if (on) ++faults_;
    return on;
  }
  bool ShortWriteNow() {
    absl::MutexLock l(&mu_);
    if (short_write_in_ <= 0 || --short_write_in_ > 0) return false;
    ++faults_;
    return true;
  }

  mutable absl::Mutex mu_;
  int short_write_in_ ABSL_GUARDED_BY(mu_) = 0;
  bool fail_rename_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_sync_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_sync_dir_ ABSL_GUARDED_BY(mu_) = false;
  int faults_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_COMMON_FAULT_FILE_SYSTEM_H_
