// Memory figures of a process from /proc/<pid>/status, for tests that bound
// what a request may cost.
#ifndef PSERVER_TESTS_TEST_UTIL_PROC_STATUS_H_
#define PSERVER_TESTS_TEST_UTIL_PROC_STATUS_H_

#include <unistd.h>

#include <fstream>
#include <string>

namespace pserver {
namespace testing_util {

// A field of /proc/<pid>/status in kB ("VmRSS", "VmHWM"); -1 if missing.
inline long StatusKb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stol(line.substr(field.size() + 1));
    }
  }
  return -1;
}

// This process's resident set in kB; -1 if /proc is not readable.
inline long RssKb() { return StatusKb(getpid(), "VmRSS"); }

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_TEST_UTIL_PROC_STATUS_H_
