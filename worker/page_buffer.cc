#include "worker/page_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/base/internal/raw_logging.h"

namespace pserver {

void PageBuffer::Allocate(size_t n) {
  Release();
  if (n == 0) return;
  void* p = mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    ABSL_RAW_LOG(FATAL, "PageBuffer: cannot map %zu bytes: %s",
                 n * sizeof(float), std::strerror(errno));
  }
  data_ = static_cast<float*>(p);
  size_ = n;
}

void PageBuffer::Release() {
  if (data_ != nullptr) munmap(data_, size_ * sizeof(float));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace pserver
