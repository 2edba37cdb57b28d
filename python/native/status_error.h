// How an absl::Status error crosses into Python: thrown as StatusError from
// C++, translated into pserver._native.Error (a RuntimeError) whose message
// is the status message, `code` the gRPC code name ("FAILED_PRECONDITION")
// and `reason` the shard's RejectReason name ("REJECT_REASON_LAYOUT_MISMATCH",
// or None).
#ifndef PSERVER_PYTHON_NATIVE_STATUS_ERROR_H_
#define PSERVER_PYTHON_NATIVE_STATUS_ERROR_H_

#include <exception>

#include <pybind11/pybind11.h>

#include "absl/status/status.h"

namespace pserver::python {

// Carries a non-OK status from C++ to TranslateStatus.
struct StatusError {
  absl::Status status;
};

// Throws StatusError when `s` is not OK.
inline void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}

// Creates pserver._native.Error on `m` and registers the translator.
// Called once, at import.
void RegisterStatusError(pybind11::module_& m);

}  // namespace pserver::python

#endif  // PSERVER_PYTHON_NATIVE_STATUS_ERROR_H_
