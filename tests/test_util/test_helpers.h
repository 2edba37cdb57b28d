// Small helpers shared by tests of every library: bit-exact comparison of
// float arrays and a free loopback port.
#ifndef PSERVER_TESTS_TEST_UTIL_TEST_HELPERS_H_
#define PSERVER_TESTS_TEST_UTIL_TEST_HELPERS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/types/span.h"

namespace pserver {
namespace testing_util {

// Same length and the same bits (NaN payloads and -0 included). Safe for
// empty arrays, whose data() may be null.
inline bool BitEqual(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A loopback port that was free a moment ago (for a server started later);
// 0 if none could be found.
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace testing_util
}  // namespace pserver

#endif  // PSERVER_TESTS_TEST_UTIL_TEST_HELPERS_H_
