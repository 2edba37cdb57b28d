#include "python/native/status_error.h"

#include <string>

#include "common/rejection.h"

namespace py = pybind11;

namespace pserver::python {
namespace {

PyObject* g_error_type = nullptr;  // pserver.Error, set at import

void TranslateStatus(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const StatusError& e) {
    py::object type = py::reinterpret_borrow<py::object>(g_error_type);
    py::object err = type(std::string(e.status.message()));
    err.attr("code") = absl::StatusCodeToString(e.status.code());
    v1::RejectReason reason = ReasonOf(e.status);
    err.attr("reason") = reason == v1::REJECT_REASON_UNSPECIFIED
                             ? py::object(py::none())
                             : py::object(py::str(ReasonName(reason)));
    PyErr_SetObject(g_error_type, err.ptr());
  }
}

}  // namespace

void RegisterStatusError(py::module_& m) {
  g_error_type = PyErr_NewExceptionWithDoc(
      // Named where users meet it (pserver.Error), not where it lives.
      "pserver.Error",
      "A refused or failed pserver call. str(e) is the shard's or client's "
      "message; e.code the gRPC code name; e.reason the shard's "
      "RejectReason name or None.",
      PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(g_error_type);
  py::register_exception_translator(&TranslateStatus);
}

}  // namespace pserver::python
