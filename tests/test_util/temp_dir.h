// A fresh folder per call for tests that touch the disk.
#ifndef PSERVER_TESTS_TEST_UTIL_TEMP_DIR_H_
#define PSERVER_TESTS_TEST_UTIL_TEMP_DIR_H_

#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace pserver {
namespace testing_util {

// Creates <gtest TempDir>/<name>.XXXXXX and returns its path (empty, with a
// test failure recorded, if it cannot be created).
inline std::string MakeTempDir(absl::string_view name) {
  std::string tmpl = ::testing::TempDir();
  if (!tmpl.empty() && tmpl.back() != '/') tmpl += '/';
  tmpl.append(name.data(), name.size());
  tmpl += ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    return "";
  }
  return buf.data();
}

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_TEST_UTIL_TEMP_DIR_H_
