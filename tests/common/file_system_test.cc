#include "common/file_system.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "gtest/gtest.h"
#include "tests/common/fault_file_system.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using testing_util::FaultFileSystem;
using testing_util::MakeTempDir;

std::vector<std::string> Sorted(FileSystem& fs, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  if (!names.ok()) return {};
  std::sort(names->begin(), names->end());
  return *names;
}

TEST(PosixFileSystem, WriteReadListRemove) {
  FileSystem& fs = *PosixFileSystem();
  const std::string dir = MakeTempDir("fs_basic") + "/sub";
  ASSERT_TRUE(fs.MakeDir(dir).ok());
  ASSERT_TRUE(fs.MakeDir(dir).ok()) << "an existing folder is fine";
  const std::string path = dir + "/a";
  ASSERT_TRUE(WriteFileAtomically(fs, path, std::string("x\0y", 3)).ok());
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());  // the Posix shorthand
  absl::StatusOr<std::string> got = ReadFileToString(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "new");
  EXPECT_EQ(Sorted(fs, dir), std::vector<std::string>{"a"});
  ASSERT_TRUE(fs.Remove(path).ok());
  EXPECT_TRUE(Sorted(fs, dir).empty());
}

TEST(PosixFileSystem, ErrorsCarryCodeAndPath) {
  FileSystem& fs = *PosixFileSystem();
  const std::string missing = MakeTempDir("fs_errors") + "/missing";
  absl::StatusOr<std::string> r = fs.ReadFile(missing);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);
  absl::Status rm = fs.Remove(missing);
  EXPECT_EQ(rm.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(rm.message().find(missing), std::string::npos);
  EXPECT_EQ(fs.ListDir(missing).status().code(), absl::StatusCode::kNotFound);
  absl::Status w = WriteFileAtomically(fs, missing + "/f", "x");
  EXPECT_EQ(w.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(w.message().find(missing + "/f.tmp"), std::string::npos) << w;
}

// Each injected failure of WriteFileAtomically: the old file is intact, no
// temporary file is left, and the error names the step and the path.
struct Fault {
  const char* name;
  void (*arm)(FaultFileSystem&);
  const char* step;
};

TEST(WriteFileAtomically, EveryFailureKeepsTheOldFileAndLeavesNoTemporary) {
  const Fault faults[] = {
      {"short write", [](FaultFileSystem& f) { f.FailWriteShort(1); }, "write"},
      {"fsync", [](FaultFileSystem& f) { f.FailSync(true); }, "fsync"},
      {"rename", [](FaultFileSystem& f) { f.FailRename(true); }, "rename"},
  };
  for (const Fault& fault : faults) {
    SCOPED_TRACE(fault.name);
    const std::string dir = MakeTempDir("fs_fault");
    const std::string path = dir + "/state";
    FaultFileSystem fs(PosixFileSystem());
    ASSERT_TRUE(WriteFileAtomically(fs, path, "old contents").ok());
    fault.arm(fs);
    absl::Status s = WriteFileAtomically(fs, path, std::string(1000, 'n'));
    EXPECT_EQ(fs.faults(), 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find(fault.step), std::string::npos) << s;
    EXPECT_NE(s.message().find(path + ".tmp"), std::string::npos) << s;
    absl::StatusOr<std::string> got = fs.ReadFile(path);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "old contents");
    EXPECT_EQ(Sorted(fs, dir), std::vector<std::string>{"state"});
  }
}

TEST(WriteFileAtomically, ShortWriteHitsTheNthAppendOnly) {
  const std::string dir = MakeTempDir("fs_nth");
  FaultFileSystem fs(PosixFileSystem());
  fs.FailWriteShort(2);
  EXPECT_TRUE(WriteFileAtomically(fs, dir + "/one", "1").ok());
  EXPECT_FALSE(WriteFileAtomically(fs, dir + "/two", "22").ok());
  EXPECT_TRUE(WriteFileAtomically(fs, dir + "/three", "333").ok());
  EXPECT_EQ(fs.faults(), 1);
  EXPECT_EQ(Sorted(fs, dir), (std::vector<std::string>{"one", "three"}));
}

// After the rename the new file is in place; a failed folder fsync cannot
// undo that, so it is not reported as a failed write.
TEST(WriteFileAtomically, FailedFolderSyncAfterTheRenameIsNotAFailure) {
  const std::string dir = MakeTempDir("fs_syncdir");
  FaultFileSystem fs(PosixFileSystem());
  fs.FailSyncDir(true);
  EXPECT_TRUE(WriteFileAtomically(fs, dir + "/f", "new").ok());
  EXPECT_EQ(fs.faults(), 1);
  EXPECT_EQ(*fs.ReadFile(dir + "/f"), "new");
}

}  // namespace
}  // namespace pserver
