// A model-sized float array taken from the kernel (an anonymous mapping) and
// given back to it when released. The replica's buffers are the size of the
// model: a freed one kept by the allocator for reuse stays resident and is
// not always the block it hands out next (tcmalloc kept the freed staging
// buffer while the error-feedback residual got fresh pages: 4 model-sized
// arrays resident where 3 were in use). Fresh pages read as zero.
//
// Usage:
//   PageBuffer b;
//   if (!b.Allocate(n).ok()) ...;   // n zeros, faulted in as written
//   b.span()[i] = ...;
//   b.Release();                     // the pages go back now
#ifndef PSERVER_WORKER_PAGE_BUFFER_H_
#define PSERVER_WORKER_PAGE_BUFFER_H_

#include <cstddef>
#include <utility>

#include "absl/types/span.h"

namespace pserver {

class PageBuffer {
 public:
  PageBuffer() = default;
  ~PageBuffer() { Release(); }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  PageBuffer(PageBuffer&& o) noexcept { swap(o); }
  PageBuffer& operator=(PageBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      swap(o);
    }
    return *this;
  }

  // `n` zeros, replacing what it held. Aborts when the kernel refuses the
  // mapping (as std::vector's allocation would).
  void Allocate(size_t n);
  void Release();

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float* data() { return data_; }
  const float* data() const { return data_; }
  absl::Span<float> span() { return absl::MakeSpan(data_, size_); }
  absl::Span<const float> span() const {
    return absl::MakeConstSpan(data_, size_);
  }
  void swap(PageBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_PAGE_BUFFER_H_
