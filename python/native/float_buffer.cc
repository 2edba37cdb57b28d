#include "python/native/float_buffer.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace py = pybind11;

namespace pserver::python {
namespace {

// numpy writes "f", "<f" or "=f" for a native little-endian float32.
bool IsFloat32(const py::buffer_info& info) {
  const std::string& f = info.format;
  return info.itemsize == 4 &&
         (f == "f" || f == "<f" || f == "=f" || f == "@f");
}

std::string ShapeText(const py::buffer_info& info) {
  std::string s = "(";
  for (size_t i = 0; i < info.shape.size(); ++i) {
    absl::StrAppend(&s, i ? ", " : "", info.shape[i]);
  }
  return absl::StrCat(s, info.shape.size() == 1 ? ",)" : ")");
}

// The numpy view (no copy) of `obj` when it is a torch.Tensor, else None.
// torch is not imported here: a tensor exists only if the caller did.
py::object TorchView(const py::handle& obj, const char* arg) {
  py::dict modules = py::module_::import("sys").attr("modules");
  if (!modules.contains("torch")) return py::none();
  py::object torch = modules["torch"];
  if (!py::isinstance(obj, torch.attr("Tensor"))) return py::none();
  std::string device = py::str(obj.attr("device"));
  if (device != "cpu") {
    throw py::value_error(
        absl::StrCat(arg, " is a tensor on ", device, "; expected a CPU tensor"));
  }
  if (!obj.attr("dtype").is(torch.attr("float32"))) {
    throw py::type_error(absl::StrCat(
        arg, " has dtype ", std::string(py::str(obj.attr("dtype"))),
        "; expected torch.float32"));
  }
  return obj.attr("detach")().attr("numpy")();
}

}  // namespace

FloatBuffer::FloatBuffer(const py::handle& given, const char* arg,
                         bool writable, long long expected_size)
    : torch_view_(TorchView(given, arg)) {
  const py::handle obj = torch_view_.is_none() ? given : torch_view_;
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(absl::StrCat(
        arg, " is a ", std::string(py::str(obj.get_type().attr("__name__"))),
        "; expected a contiguous float32 buffer (a numpy array or a CPU "
        "torch.Tensor)"));
  }
  // PyBUF_STRIDES | PyBUF_FORMAT: any layout, so that a non-contiguous
  // array gets the message below rather than the exporter's own.
  int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  Py_buffer* view = new Py_buffer();
  if (PyObject_GetBuffer(obj.ptr(), view, flags) != 0) {
    PyErr_Clear();
    const bool read_only =
        writable &&
        PyObject_GetBuffer(obj.ptr(), view, PyBUF_STRIDES | PyBUF_FORMAT) == 0;
    if (read_only) PyBuffer_Release(view);
    PyErr_Clear();
    delete view;
    if (read_only) {
      throw py::value_error(absl::StrCat(
          arg, " is read-only; expected a writable float32 buffer"));
    }
    throw py::type_error(absl::StrCat(
        arg, " does not export a strided buffer; expected a contiguous "
             "float32 buffer"));
  }
  info_ = py::buffer_info(view, /*ownview=*/true);
  if (!IsFloat32(info_)) {
    throw py::type_error(absl::StrCat(arg, " has element format '",
                                      info_.format, "' of ", info_.itemsize,
                                      " bytes; expected float32 ('f')"));
  }
  // C-contiguous: strides are the running products of the trailing dims.
  py::ssize_t expected_stride = info_.itemsize;
  for (py::ssize_t d = info_.ndim - 1; d >= 0; --d) {
    if (info_.shape[d] != 1 && info_.strides[d] != expected_stride) {
      throw py::value_error(absl::StrCat(
          arg, " is not contiguous (shape ", ShapeText(info_), ", strides ",
          absl::StrJoin(info_.strides, ", "),
          " bytes); expected a C-contiguous float32 buffer (call "
          ".contiguous() or numpy.ascontiguousarray first)"));
    }
    expected_stride *= info_.shape[d];
  }
  size_ = static_cast<size_t>(info_.size);
  if (expected_size >= 0 && static_cast<long long>(size_) != expected_size) {
    throw py::value_error(absl::StrCat(arg, " holds ", size_,
                                       " float32 elements (shape ",
                                       ShapeText(info_), "); expected ",
                                       expected_size));
  }
  data_ = static_cast<float*>(info_.ptr);
}

}  // namespace pserver::python
