// pserver._native: the C++ client library (worker/client.h) for Python.
// Tensors cross as float32 buffers without copies (python/native/
// float_buffer.h); every RPC runs with the GIL released; an absl::Status
// error becomes pserver.Error (a RuntimeError) whose message is the
// shard's or client's message and whose `code` is the gRPC code name
// ("FAILED_PRECONDITION") and `reason` the shard's RejectReason name
// ("REJECT_REASON_LAYOUT_MISMATCH", or None).
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/rejection.h"
#include "python/native/float_buffer.h"
#include "python/native/model_wait.h"
#include "worker/client.h"

namespace py = pybind11;

namespace pserver::python {
namespace {

// Carries a non-OK status from C++ to the translator below.
struct StatusError {
  absl::Status status;
};

PyObject* g_error_type = nullptr;  // pserver._native.Error, set at import

void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw StatusError{s};
}

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

v1::Codec CodecArg(const std::string& name, const char* arg) {
  absl::StatusOr<v1::Codec> c = ParseCodecName(name);
  if (!c.ok()) {
    throw py::value_error(absl::StrCat(arg, ": ", c.status().message()));
  }
  return *c;
}

absl::Duration SecondsArg(double s, const char* arg) {
  if (!(s > 0) || s > 86400 * 7) {
    throw py::value_error(
        absl::StrCat(arg, " is ", s, "; expected 0 < seconds <= 604800"));
  }
  return absl::Seconds(s);
}

// One pserver::Client. Thread-compatible like the client it wraps; a second
// thread calling in while an RPC is in flight (GIL released) gets a
// RuntimeError instead of a data race.
class PyClient {
 public:
  PyClient(std::vector<std::string> servers, uint32_t worker_id,
           uint32_t num_workers, const std::string& push_codec,
           const std::string& warmup_codec, uint32_t block_size,
           double k_fraction, uint32_t bits, float ef_decay, uint64_t seed,
           double rpc_timeout, double pull_timeout, double retry_budget) {
    options_.server_addresses = std::move(servers);
    options_.worker_id = worker_id;
    options_.num_workers = num_workers;
    options_.push_codec = CodecArg(push_codec, "push_codec");
    options_.warmup_codec = CodecArg(warmup_codec, "warmup_codec");
    options_.push_params.set_block_size(block_size);
    options_.push_params.set_k_fraction(k_fraction);
    options_.push_params.set_bits(bits);
    options_.warmup_params = options_.push_params;
    options_.ef_decay = ef_decay;
    options_.seed = seed;
    options_.rpc_timeout = SecondsArg(rpc_timeout, "rpc_timeout");
    options_.pull_timeout = SecondsArg(pull_timeout, "pull_timeout");
    options_.retry_budget = SecondsArg(retry_budget, "retry_budget");
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options_);
    ThrowIfError(c.status());
    client_ = *std::move(c);
  }

  // Registers the layout (names and shapes, in order) with every shard.
  // Ranks other than 0 first wait (up to retry_budget) until rank 0 has
  // installed its weights, so rank 0's initial weights are everyone's.
  // `out` (optional) receives the shards' weights.
  void Register(const std::vector<std::string>& names,
                const std::vector<std::vector<uint64_t>>& shapes,
                const py::handle& initial_weights, const py::handle& out) {
    if (names.size() != shapes.size()) {
      throw py::value_error(absl::StrCat("names has ", names.size(),
                                         " entries and shapes ", shapes.size(),
                                         "; expected one shape per name"));
    }
    v1::ModelLayout layout;
    for (size_t i = 0; i < names.size(); ++i) {
      v1::TensorSpec* t = layout.add_tensors();
      t->set_name(names[i]);
      for (uint64_t d : shapes[i]) t->add_shape(d);
    }
    // Layout errors (empty, repeated name, zero dimension) before anything
    // is sent, with the layout's own message.
    absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(layout);
    if (!slots.ok()) throw py::value_error(std::string(slots.status().message()));
    const long long total = static_cast<long long>(TotalElements(layout));
    FloatBuffer init(initial_weights, "initial_weights", false, total);
    std::unique_ptr<FloatBuffer> dst;
    if (!out.is_none()) {
      dst = std::make_unique<FloatBuffer>(out, "out", true, total);
    }
    Call([&] {
      if (options_.worker_id != 0) {
        if (absl::Status s = WaitForModel(options_.server_addresses,
                                          options_.retry_budget);
            !s.ok()) {
          return s;
        }
      }
      absl::Status s = client_->Register(layout, init.span());
      if (s.ok() && dst) CopyWeights(dst->mutable_span());
      return s;
    });
  }

  // Pushes `gradient` for the current step and writes the next weights into
  // `out`. Both are checked (size num_params) before anything is sent; on
  // any error `out` and the client's step are unchanged.
  uint64_t Step(const py::handle& gradient, const py::handle& out) {
    Registered();
    const long long n = static_cast<long long>(client_->num_params());
    FloatBuffer g(gradient, "gradient", false, n);
    FloatBuffer dst(out, "out", true, n);
    Call([&] {
      absl::Status s = client_->Step(g.span());
      if (s.ok()) CopyWeights(dst.mutable_span());
      return s;
    });
    return client_->step();
  }

  void CopyWeightsInto(const py::handle& out) {
    Registered();
    FloatBuffer dst(out, "out", true,
                    static_cast<long long>(client_->num_params()));
    CopyWeights(dst.mutable_span());
  }

  // The client's state (error-feedback residuals of every shard and
  // stage, worker id, worker count, shard ranges, step) as the record
  // worker/client_state.cc writes for --state_file.
  py::bytes SerializeState() const {
    Registered();
    absl::StatusOr<std::string> record = client_->SerializeState();
    ThrowIfError(record.status());
    return py::bytes(*record);
  }

  // Restores a record from SerializeState() (or a --state_file), refused
  // with pserver.Error (state unchanged) when it is corrupt or for another
  // worker id, worker count, shard layout or model size.
  void RestoreState(const py::bytes& record, const std::string& source) {
    Registered();
    std::string bytes = record;
    Call([&] { return client_->RestoreState(bytes, source); });
  }

  uint64_t step() const { return client_->step(); }
  double residual_norm() const { return client_->ResidualNorm(); }
  uint64_t num_params() const { return client_->num_params(); }
  bool registered() const { return registered_; }
  std::string stage() const {
    return registered_ ? v1::OptimizerStage_Name(client_->stage()) : "";
  }

  py::dict Stats() const {
    const ClientStats& s = client_->stats();
    py::dict d;
    d["steps"] = s.steps;
    d["push_payload_bytes"] = s.push_payload_bytes;
    d["pull_payload_bytes"] = s.pull_payload_bytes;
    d["push_fp32_bytes"] = s.push_fp32_bytes;
    d["pull_fp32_bytes"] = s.pull_fp32_bytes;
    uint64_t sent = s.push_payload_bytes + s.pull_payload_bytes;
    d["compression_ratio"] =
        sent == 0 ? 0.0
                  : static_cast<double>(s.push_fp32_bytes + s.pull_fp32_bytes) /
                        static_cast<double>(sent);
    d["snapshots"] = s.snapshots;
    d["checksum_mismatches"] = s.checksum_mismatches;
    d["retries"] = s.retries;
    d["rejoins"] = s.rejoins;
    d["encode_seconds"] = s.encode_seconds;
    d["push_seconds"] = s.push_seconds;
    d["pull_seconds"] = s.pull_seconds;
    return d;
  }

 private:
  void Registered() const {
    if (!registered_) {
      throw py::value_error("the client is not registered; call register() "
                            "first");
    }
  }

  void CopyWeights(absl::Span<float> dst) const {
    absl::Span<const float> w = client_->weights();
    std::copy(w.begin(), w.end(), dst.begin());
  }

  // Runs `rpc` (returning absl::Status) without the GIL, one at a time.
  template <typename F>
  void Call(F rpc) {
    if (busy_.exchange(true)) {
      throw std::runtime_error(
          "pserver Client is already in a call from another thread; a Client "
          "serves one training loop");
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = rpc();
    }
    busy_.store(false);
    if (s.ok()) registered_ = true;
    ThrowIfError(s);
  }

  ClientOptions options_;
  std::unique_ptr<Client> client_;
  bool registered_ = false;
  std::atomic<bool> busy_{false};
};

}  // namespace
}  // namespace pserver::python

PYBIND11_MODULE(_native, m) {
  using pserver::python::PyClient;
  m.doc() = "pserver's C++ client library (worker/client.h)";
  pserver::python::g_error_type = PyErr_NewExceptionWithDoc(
      "pserver._native.Error",
      "A refused or failed pserver call. str(e) is the shard's or client's "
      "message; e.code the gRPC code name; e.reason the shard's "
      "RejectReason name or None.",
      PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(pserver::python::g_error_type);
  py::register_exception_translator(&pserver::python::TranslateStatus);

  py::class_<PyClient>(m, "Client")
      .def(py::init<std::vector<std::string>, uint32_t, uint32_t,
                    const std::string&, const std::string&, uint32_t, double,
                    uint32_t, float, uint64_t, double, double, double>(),
           py::arg("servers"), py::arg("worker_id"), py::arg("num_workers"),
           py::arg("push_codec") = "onebit", py::arg("warmup_codec") = "fp32",
           py::arg("block_size") = 256, py::arg("k_fraction") = 0.01,
           py::arg("bits") = 8, py::arg("ef_decay") = 1.0f,
           py::arg("seed") = 1, py::arg("rpc_timeout") = 30.0,
           py::arg("pull_timeout") = 120.0, py::arg("retry_budget") = 300.0)
      .def("register", &PyClient::Register, py::arg("names"),
           py::arg("shapes"), py::arg("initial_weights"),
           py::arg("out") = py::none())
      .def("step", &PyClient::Step, py::arg("gradient"), py::arg("out"))
      .def("copy_weights_into", &PyClient::CopyWeightsInto, py::arg("out"))
      .def("serialize_state", &PyClient::SerializeState)
      .def("restore_state", &PyClient::RestoreState, py::arg("record"),
           py::arg("source") = "state record")
      .def_property_readonly("residual_norm", &PyClient::residual_norm)
      .def_property_readonly("global_step", &PyClient::step)
      .def_property_readonly("num_params", &PyClient::num_params)
      .def_property_readonly("registered", &PyClient::registered)
      .def_property_readonly("stage", &PyClient::stage)
      .def("stats", &PyClient::Stats);
}
