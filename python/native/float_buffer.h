// A Python object's memory seen as a flat, contiguous float32 array, checked
// before any C++ code touches it: the extension's one door for tensors.
#ifndef PSERVER_PYTHON_NATIVE_FLOAT_BUFFER_H_
#define PSERVER_PYTHON_NATIVE_FLOAT_BUFFER_H_

#include <cstddef>
#include <string>

#include <pybind11/pybind11.h>

#include "absl/types/span.h"

namespace pserver::python {

// Holds the buffer view (Py_buffer) for its lifetime, so the exporter (a
// numpy array, or the numpy view of a CPU torch.Tensor) stays alive and its
// memory in place. Created and destroyed with the GIL held; the span may be
// used without it. Not copyable.
class FloatBuffer {
 public:
  // Views `obj` through the buffer protocol; a torch.Tensor (which has no
  // buffer of its own) through its numpy view, after checking that it is a
  // float32 CPU tensor (TypeError / ValueError naming its dtype or device).
  // Raises TypeError when `obj` has no buffer or is not float32, ValueError when it is not C-contiguous
  // or (expected_size >= 0) does not hold exactly expected_size elements,
  // and ValueError when `writable` and the buffer is read-only. Every
  // message names `arg` and the expectation, e.g. "gradient has dtype
  // float64 (format 'd'); expected float32".
  FloatBuffer(const pybind11::handle& obj, const char* arg, bool writable,
              long long expected_size);

  size_t size() const { return size_; }
  float* data() const { return data_; }
  absl::Span<const float> span() const { return {data_, size_}; }
  absl::Span<float> mutable_span() const { return {data_, size_}; }

 private:
  pybind11::object torch_view_;  // the numpy view of a torch.Tensor
  pybind11::buffer_info info_;
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pserver::python

#endif  // PSERVER_PYTHON_NATIVE_FLOAT_BUFFER_H_
