#include "common/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path);
  std::string data;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view data) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("create", tmp);
  absl::Status st;
  size_t done = 0;
  while (st.ok() && done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      st = ErrnoError("write", tmp);
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoError("fsync", tmp);
  if (::close(fd) != 0 && st.ok()) st = ErrnoError("close", tmp);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoError("rename", tmp);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  // The rename is durable only once the folder is synced.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace pserver
