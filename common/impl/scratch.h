// Private to common/impl: workspaces that codecs reuse from call to call, so
// that a steady stream of encodes (and randomk's decodes) allocates nothing
// once warm: no per-call vectors for samples, histograms, index lists.
#ifndef PSERVER_COMMON_IMPL_SCRATCH_H_
#define PSERVER_COMMON_IMPL_SCRATCH_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pserver {
namespace impl {

// A growable array of trivially copyable T whose contents are not
// initialised: Reserve keeps the storage when it is large enough, so reuse
// costs neither an allocation nor a zero-fill (std::vector::resize does).
// Thread-compatible.
template <typename T>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  // Room for n elements. Contents are unspecified: kept when the storage was
  // large enough, garbage after a growth.
  T* Reserve(size_t n) {
    if (n > capacity_) {
      // Grow by at least half, so that slowly growing sizes settle.
      capacity_ = std::max(n, capacity_ + capacity_ / 2);
      data_.reset(new T[capacity_]);  // default-initialised: no fill
    }
    return data_.get();
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<T[]> data_;
  size_t capacity_ = 0;
};

// Workspaces of type T for a codec whose methods may run concurrently
// (codec.h: codecs are immutable and thread-safe): each call leases one;
// calls one at a time reuse the same one, concurrent calls get one each.
// Workspaces live as long as the pool. Thread-safe.
template <typename T>
class ScratchPool {
 public:
  // A workspace for the lifetime of the lease; returned to the pool by the
  // destructor. Not copyable or movable: keep it on the stack of the call.
  class Lease {
   public:
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { pool_->Give(std::move(item_)); }
    T* operator->() const { return item_.get(); }
    T& operator*() const { return *item_; }

   private:
    friend class ScratchPool;
    Lease(ScratchPool* pool, std::unique_ptr<T> item)
        : pool_(pool), item_(std::move(item)) {}
    ScratchPool* pool_;
    std::unique_ptr<T> item_;
  };

  // A free workspace, or a new one if every workspace is leased.
  Lease Take() ABSL_LOCKS_EXCLUDED(mu_) {
    std::unique_ptr<T> item;
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        item = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!item) item = std::make_unique<T>();
    return Lease(this, std::move(item));
  }

 private:
  void Give(std::unique_ptr<T> item) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    free_.push_back(std::move(item));
  }

  absl::Mutex mu_;
  std::vector<std::unique_ptr<T>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace impl
}  // namespace pserver

#endif  // PSERVER_COMMON_IMPL_SCRATCH_H_
